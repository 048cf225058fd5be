"""Environment & runtime stack: versions, the fingerprint, tool outcomes and the ldd layers per target."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.runtime_stack import LAYER_NAMES, LAYERS

ORDER = 20
ID = "environment"
TITLE = "Environment & runtime stack"
TEMPLATE = "environment.html.j2"


def build(ctx: Any) -> dict[str, Any] | None:
    targets = []
    for target in ctx.results.targets:
        env = ctx.results.env(target)
        if env is None:
            continue
        env_dir = ctx.results.path(target, "env")
        tools = pd.read_csv(env_dir / "tools.csv") if (env_dir / "tools.csv").exists() else pd.DataFrame()
        stack = (
            pd.read_csv(env_dir / "runtime_stack.csv") if (env_dir / "runtime_stack.csv").exists() else pd.DataFrame()
        )
        layers = []
        if not stack.empty:
            for layer, _ in LAYERS:
                libs = stack[stack["layer"] == layer]
                if layer == "system" or libs.empty:
                    continue
                layers.append(
                    {
                        "name": LAYER_NAMES[layer],
                        "layer": layer,
                        "libraries": [
                            {"name": r.library, "origin": r.origin, "path": r.path} for r in libs.itertuples()
                        ],
                    }
                )
        if not tools.empty:
            tools = tools.assign(raw=[ctx.link(env_dir / f) for f in tools["raw_file"]])
        device = env.get("device", {})
        versions = {
            "Python": env.get("python", {}).get("version"),
            **{k: v for k, v in env.get("packages", {}).items() if v},
            "HIP runtime": device.get("hip_version"),
            "CUDA runtime": device.get("cuda_version"),
            "hipcc": env.get("compilers", {}).get("hipcc", {}).get("version") or None,
            "nvcc": env.get("compilers", {}).get("nvcc", {}).get("version") or None,
        }
        targets.append(
            {
                "name": target,
                "env": env,
                "device": device,
                "versions": {k: v for k, v in versions.items() if v},
                "smi": env.get("smi", {}),
                "tools": tools,
                "layers": layers,
                "stack": stack.drop(columns=[c for c in ("target", "fingerprint", "status", "reason") if c in stack]),
            }
        )
    return {"targets": targets} if targets else None
