"""Environment & runtime stack: versions side by side, the fingerprint, tool outcomes and the ldd layers.

The stack is drawn as the chain a PyTorch call goes down (PyTorch -> HIP/CUDA runtime -> HSA runtime
-> kernel-driver interface) with the libraries that sit on the runtime beside it (math, code-object
compiler, collectives, tracing). Layers a build does not load are drawn dashed, so a CPU-only build or
a CUDA build (which has no HSA layer) reads at a glance.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.env.runtime_stack import LAYER_NAMES

ORDER = 20
ID = "environment"
TITLE = "Environment & runtime stack"
TEMPLATE = "environment.html.j2"

CHAIN = ("framework", "gpu_runtime", "hsa_runtime", "driver")
BESIDE = ("math", "compiler", "communication", "profiling")
ABSENT_WHY = {
    "gpu_runtime": "no GPU runtime linked (CPU-only build)",
    "hsa_runtime": "not part of this backend's stack (HSA is ROCm's layer)",
    "driver": "no driver interface linked directly",
}


def _layer(stack: pd.DataFrame, layer: str, backend: str) -> dict[str, Any]:
    libs = stack[stack["layer"] == layer] if not stack.empty else stack
    why = ""
    if libs.empty:
        why = ABSENT_WHY.get(layer, "none loaded")
        if layer == "hsa_runtime" and backend == "rocm":
            why = "not linked directly by torch's libraries"
        if layer == "driver" and backend == "cuda":
            why = "libcuda.so is opened at run time (dlopen), so ldd does not list it"
    return {
        "layer": layer,
        "name": LAYER_NAMES[layer],
        "absent": libs.empty,
        "why": why,
        "libraries": [{"name": r.library, "origin": r.origin, "path": r.path if isinstance(r.path, str) else "",
                       "vendor": r.vendor} for r in libs.itertuples()],
    }


def _versions(env: dict[str, Any]) -> dict[str, str]:
    device = env.get("device", {})
    compilers = env.get("compilers", {})
    smi = env.get("smi", {}) or {}
    versions = {
        "Device": device.get("name"),
        "Architecture": device.get("arch_full") or device.get("arch"),
        "Backend": device.get("backend"),
        "Driver": (smi.get("rocm_smi") or {}).get("driver_version")
        or (smi.get("nvidia_smi") or {}).get("driver_version"),
        "Driver's CUDA version": (smi.get("nvidia_smi") or {}).get("cuda_version"),
        **_memory_pools(env.get("gpu_memory") or {}),
        "HIP runtime": device.get("hip_version"),
        "CUDA runtime": device.get("cuda_version"),
        "OS": env.get("os", {}).get("release"),
        "Kernel": env.get("os", {}).get("kernel"),
        "CPU": env.get("cpu", {}).get("model"),
        "Python": env.get("python", {}).get("version"),
        **{name: version for name, version in env.get("packages", {}).items() if version},
        "hipcc": (compilers.get("hipcc") or {}).get("version") or None,
        "nvcc": (compilers.get("nvcc") or {}).get("version") or None,
        "Workflow commit": ((env.get("git") or {}).get("commit") or "")[:12] or None,
        "Config hash": env.get("config_hash"),
        "Environment hash": env.get("fingerprint"),
    }
    return {k: str(v) for k, v in versions.items() if v not in (None, "")}


def _memory_pools(memory: dict[str, Any]) -> dict[str, str]:
    """VRAM and GTT as the SMI reports them: on an iGPU, VRAM is the firmware's carve-out of host memory and GTT
    the host memory the GPU maps besides, so the GPU's memory is the host's."""
    rows = {}
    for pool, label in (("vram", "GPU memory: VRAM"), ("gtt", "GPU memory: GTT (host memory mapped for the GPU)")):
        total, used = memory.get(f"{pool}_total_bytes"), memory.get(f"{pool}_used_bytes")
        if total is not None:
            rows[label] = f"{total / 2**30:.1f} GiB" + (f", {used / 2**30:.1f} GiB used" if used is not None else "") \
                + f" ({memory.get('source', 'smi')})"
    return rows


def _facts(env: dict[str, Any]) -> dict[str, Any]:
    """What the page says about a capture, with a placeholder for anything an older or partial
    env.json lacks (results copied in from elsewhere may predate a field)."""
    device = env.get("device", {}) or {}
    cpu = env.get("cpu", {}) or {}
    rocm = device.get("backend") == "rocm"
    return {
        "fingerprint": env.get("fingerprint", "–"),
        "host": env.get("host", "–"),
        "captured": env.get("captured_at", "–"),
        "cpu": cpu.get("model", "unknown CPU"),
        "threads": cpu.get("logical_cores", "?"),
        "gpu": bool(device.get("gpu_available")),
        "reason": device.get("reason") or "no GPU was used",
        "devices": device.get("device_count", "?"),
        "memory_gib": (device.get("total_memory_bytes") or 0) / 2**30,
        "units": device.get("multiprocessor_count", "?"),
        "unit_name": "compute units" if rocm else "multiprocessors",
        "warp_name": "wavefront" if rocm else "warp",
        "warp": device.get("warp_size", "?"),
        "l2_mib": (device.get("l2_cache_bytes") or 0) / 2**20,
    }


def _read(ctx: Any, path: Any) -> pd.DataFrame:
    return ctx.results.read_csv(path) if path.is_file() else pd.DataFrame()


def build(ctx: Any) -> dict[str, Any] | None:
    targets = []
    versions: dict[str, dict[str, str]] = {}
    for target in ctx.results.targets:
        env = ctx.results.env(target)
        if env is None:
            continue
        env_dir = ctx.results.path(target, "env")
        tools = _read(ctx, env_dir / "tools.csv")
        stack = _read(ctx, env_dir / "runtime_stack.csv")
        if not stack.empty and "layer" not in stack.columns:
            stack = pd.DataFrame()
        device = env.get("device", {})
        backend = device.get("backend", "cpu")
        if not tools.empty and "raw_file" in tools.columns:
            raw = [ctx.results.own_file(target, f, under="env", cell=f"{target}/env/tools.csv: raw_file")
                   if isinstance(f, str) else None for f in tools["raw_file"]]
            tools = tools.assign(raw=[ctx.link(p) if p else "" for p in raw])
        versions[target] = _versions(env)
        targets.append({
            "name": target,
            "facts": _facts(env),
            "label": ctx.target_labels.get(target, target),
            "layers": {layer: _layer(stack, layer, backend) for layer in (*CHAIN, *BESIDE)},
            "has_stack": not stack.empty,
            "tools": tools.to_dict("records") if not tools.empty else [],
            "stack": stack.drop(columns=[c for c in ("target", "fingerprint", "status", "reason") if c in stack]),
            "env_link": ctx.link(env_dir / "env.json"),
        })
    if not targets:
        return None
    names = list(versions)
    keys = list(dict.fromkeys(k for v in versions.values() for k in v))
    rows = [{"key": k, "values": [versions[t].get(k, "–") for t in names],
             "differs": len({versions[t].get(k, "–") for t in names}) > 1} for k in keys]
    stacked = [t for t in targets if t["has_stack"]]
    beside = [layer for layer in BESIDE if any(not t["layers"][layer]["absent"] for t in stacked)]
    return {"targets": targets, "version_targets": names, "version_rows": rows, "multi": len(names) > 1,
            "stacked": stacked, "chain": [(layer, LAYER_NAMES[layer]) for layer in CHAIN],
            "beside": [(layer, LAYER_NAMES[layer]) for layer in beside],
            "no_stack": [t["name"] for t in targets if not t["has_stack"]]}
