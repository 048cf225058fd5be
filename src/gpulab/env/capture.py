"""Environment capture: the structured fingerprint (env.json) and raw outputs of the GPU tools.

An absent or failing tool (no driver, no GPU) is a recorded outcome with its exit status and message,
never a crash. The fingerprint id derived from env.json is stamped on every CSV row of later steps.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from gpulab.core.device import DeviceInfo, cpu_model_name, detect
from gpulab.core.tables import Column, TableSchema, write_atomic
from gpulab.core.tools import ToolResult, run_tool

# Keys of env.json that identify the software/hardware; the rest (time, host) describe the capture. The
# configuration is not among them: it is recorded per step (each job's params in its benchmark record) and in
# the report, so changing one setting reruns only the steps that read it.
FINGERPRINT_KEYS = ("os", "cpu", "python", "packages", "device", "compilers", "git")
TRACKED_PACKAGES = (
    "torch",
    "triton",
    "pytorch-triton-rocm",
    "transformers",
    "tokenizers",
    "modelscope",
    "numpy",
    "snakemake",
    "gpulab",
)


def package_versions(names: Sequence[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(repo: Path | None = None) -> dict[str, Any]:
    """Commit of the checkout the run is in (the working directory) and whether its tree had uncommitted changes."""
    repo = repo or Path.cwd()
    head = run_tool("git", ["git", "-C", str(repo), "rev-parse", "HEAD"], timeout_s=30)
    if head.status != "ok":
        return {"commit": None, "dirty": None, "reason": head.reason}
    status = run_tool("git", ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], timeout_s=30)
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.status == "ok" else None}


def os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def fingerprint_id(env: Mapping[str, Any]) -> str:
    """Short stable id of the identifying part of env.json."""
    subset = {k: env.get(k) for k in FINGERPRINT_KEYS}
    return hashlib.sha256(json.dumps(subset, sort_keys=True, default=str).encode()).hexdigest()[:12]


def build_env(
    *, target: str, compilers: Mapping[str, Any], device: DeviceInfo | None = None
) -> dict[str, Any]:
    info = device or detect()
    env: dict[str, Any] = {
        "target": target,
        "captured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "os": {"release": os_release(), "kernel": platform.release(), "machine": platform.machine()},
        "cpu": {"model": cpu_model_name(), "logical_cores": os.cpu_count()},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "packages": package_versions(),
        "device": info.as_dict(),
        "compilers": dict(compilers),
        "git": git_state(),
    }
    env["fingerprint"] = fingerprint_id(env)
    return env


def write_env_json(path: str | Path, env: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(env, indent=2, sort_keys=True, default=str) + "\n")


def read_env(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def read_fingerprint(env_json: str | Path) -> str:
    """The fingerprint id later steps put on every row (pass ``results/<target>/env/env.json``)."""
    return str(read_env(env_json)["fingerprint"])


TOOLS = TableSchema(
    "tools",
    (
        Column("tool", "str", "what was asked (rocm-smi, nvidia-smi, hipcc, ldd:libtorch_python.so...)"),
        Column("argv", "str", "the command line"),
        Column("exit_status", "int", "exit status; empty when the tool is absent or timed out"),
        Column("required", "bool", "expected on this machine's backend (strict mode enforces only these)"),
        Column("raw_file", "str", "raw output under env/raw/"),
    ),
    path="env/tools.csv",
)


def tool_commands(python: str = sys.executable) -> list[tuple[str, list[str], set[str]]]:
    """(name, argv, backends on which the tool is required)."""
    return [
        ("rocm-smi", ["rocm-smi"], {"rocm"}),
        (
            "rocm-smi-json",
            ["rocm-smi", "--showproductname", "--showdriverversion", "--showmeminfo", "vram", "gtt", "--showuse",
             "--json"],
            {"rocm"},
        ),
        # amd-smi succeeds rocm-smi from ROCm 6 on; older installs lack it.
        ("amd-smi-static", ["amd-smi", "static", "--asic", "--vram", "--json"], set()),
        ("amd-smi-metric", ["amd-smi", "metric", "--mem-usage", "--json"], set()),
        ("rocminfo", ["rocminfo"], {"rocm"}),
        ("nvidia-smi", ["nvidia-smi", "-q"], {"cuda"}),
        ("hipcc", ["hipcc", "--version"], set()),
        ("nvcc", ["nvcc", "--version"], {"cuda"}),
        ("collect_env", [python, "-m", "torch.utils.collect_env"], {"rocm", "cuda", "cpu"}),
        ("pip-freeze", [python, "-m", "pip", "freeze", "--all"], {"rocm", "cuda", "cpu"}),
    ]


def _no_device_on_empty_output(result: ToolResult) -> ToolResult:
    # rocm-smi on a machine without an AMD GPU exits 0, prints nothing and complains on stderr.
    if result.status == "ok" and not result.stdout.strip() and result.stderr.strip():
        why = result.stderr.strip().splitlines()[-1][:300]
        return ToolResult(
            result.tool, result.argv, "skipped", result.exit_status, f"no AMD GPU: {why}", result.stdout, result.stderr
        )
    return result


def _no_device_when_kernel_driver_absent(result: ToolResult) -> ToolResult:
    # rocminfo exits 1 with "ROCk module is NOT loaded" when the amdgpu kernel driver is absent: no device,
    # which is the expected state of a non-AMD machine, not a broken tool.
    if result.status == "failed" and "ROCk module is NOT loaded" in result.stdout + result.stderr:
        return ToolResult(
            result.tool,
            result.argv,
            "skipped",
            result.exit_status,
            "no AMD GPU: ROCk (amdgpu) kernel module is not loaded",
            result.stdout,
            result.stderr,
        )
    return result


def torch_libraries() -> tuple[str | None, list[Path]]:
    """torch's lib directory and the libraries whose dependencies make up the runtime stack."""
    try:
        import torch
    except ImportError:
        return None, []
    lib = Path(torch.__file__).resolve().parent / "lib"
    names = ["libtorch_python.so", "libtorch_hip.so", "libtorch_cuda.so"]
    return str(lib), [lib / n for n in names if (lib / n).exists()]


def _raw_text(result: ToolResult) -> str:
    return (
        f"$ {' '.join(result.argv)}\n# status: {result.status}; exit status: {result.exit_status}; "
        f"{result.reason}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def capture(
    out_dir: str | Path, *, target: str, timeout_s: float = 120, device: DeviceInfo | None = None
) -> dict[str, Any]:
    """Write env.json, tools.csv, runtime_stack.csv and raw/ under ``out_dir``; return env.json's content."""
    from gpulab.env.runtime_stack import RUNTIME_STACK, stack_rows

    out = Path(out_dir)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    info = device or detect()
    lib_dir, libs = torch_libraries()
    ldd = {lib.name: f"ldd:{lib.name}" for lib in libs}
    results, required = _run_tools(info, timeout_s, [(ldd[lib.name], ["ldd", str(lib)]) for lib in libs])
    ldd_outputs = [(name, results[tool].stdout) for name, tool in ldd.items() if results[tool].status == "ok"]

    env = build_env(target=target, device=info, compilers={n: _version_line(results[n]) for n in ("hipcc", "nvcc")})
    base = {"target": target, "fingerprint": env["fingerprint"]}
    tool_rows = []
    for name, result in results.items():
        raw_file = f"raw/{name.replace(':', '_')}.txt"
        write_atomic(out / raw_file, _raw_text(result))
        tool_rows.append({**base, "status": result.status, "reason": result.reason, "tool": name,
                          "argv": " ".join(result.argv), "exit_status": result.exit_status,
                          "required": required[name], "raw_file": raw_file})
    env["smi"] = _parsed_smi(results)
    env["gpu_memory"] = gpu_memory(env["smi"])
    env["tools"] = {name: r.summary() for name, r in results.items()}

    stack = stack_rows(ldd_outputs, lib_dir)
    RUNTIME_STACK.write([{**base, "status": "ok", **row} for row in stack], out / "runtime_stack.csv")
    TOOLS.write(tool_rows, out / "tools.csv")
    write_env_json(out / "env.json", env)
    return env


def _run_tools(info: DeviceInfo, timeout_s: float, ldd: Sequence[tuple[str, list[str]]] = ()
               ) -> tuple[dict[str, ToolResult], dict[str, bool]]:
    """Every tool's result (and each ``ldd`` command's, always required), and whether the device's backend needs
    it. The tools run at once: one after the other they took 9 s of the H100 run's first job, on which every other
    job waits (collect_env alone imports PyTorch)."""
    commands = [(name, argv, info.backend in backends) for name, argv, backends in tool_commands()]
    commands += [(name, argv, True) for name, argv in ldd]
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        ran = list(pool.map(lambda c: run_tool(c[0], c[1], timeout_s), commands))
    results: dict[str, ToolResult] = {}
    required: dict[str, bool] = {}
    for (name, _, needed), result in zip(commands, ran, strict=True):
        if name.startswith(("rocm-smi", "amd-smi")):
            result = _no_device_on_empty_output(result)
        elif name == "rocminfo":
            result = _no_device_when_kernel_driver_absent(result)
        results[name] = result
        required[name] = needed
    return results, required


def _parsed_smi(results: dict[str, ToolResult]) -> dict[str, Any]:
    """What the vendor tools that ran report, parsed; an unparseable output is recorded, its raw file kept."""
    from gpulab.core.smi import parse_amd_smi, parse_nvidia_smi_q, parse_rocm_smi_json, parse_rocminfo

    smi: dict[str, Any] = {}
    try:
        amd: dict[Any, dict[str, Any]] = {}  # per GPU: static's product and metric's memory, merged
        for name in ("amd-smi-static", "amd-smi-metric"):
            if results[name].status == "ok":
                for d in parse_amd_smi(results[name].stdout):
                    merged = amd.setdefault(d["gpu"], {})
                    merged.update({k: v for k, v in d.items() if v is not None or k not in merged})
        if amd:
            smi["amd_smi"] = list(amd.values())
        if results["rocm-smi-json"].status == "ok":
            smi["rocm_smi"] = parse_rocm_smi_json(results["rocm-smi-json"].stdout)
        if results["rocminfo"].status == "ok":
            smi["rocminfo_gpus"] = parse_rocminfo(results["rocminfo"].stdout)
        if results["nvidia-smi"].status == "ok":
            smi["nvidia_smi"] = parse_nvidia_smi_q(results["nvidia-smi"].stdout)
    except (ValueError, KeyError) as exc:
        smi["parse_error"] = f"{type(exc).__name__}: {exc}"
    return smi


MEMORY_FIELDS = ("vram_total_bytes", "vram_used_bytes", "gtt_total_bytes", "gtt_used_bytes")


def gpu_memory(smi: dict[str, Any]) -> dict[str, Any] | None:
    """The first AMD GPU's memory pools: VRAM (on an iGPU, the firmware's carve-out of host memory) and GTT (host
    memory the GPU maps; on an iGPU most of what it can use). amd-smi's figures first, rocm-smi's fill the gaps."""
    sources = [("amd-smi", d) for d in (smi.get("amd_smi") or [])[:1]]
    sources += [("rocm-smi", d) for d in ((smi.get("rocm_smi") or {}).get("devices") or [])[:1]]
    memory: dict[str, Any] = {}
    for tool, device in sources:
        for field in MEMORY_FIELDS:
            if memory.get(field) is None and device.get(field) is not None:
                memory[field] = device[field]
                memory.setdefault("source", tool)
    return memory or None


def _version_line(result: ToolResult) -> dict[str, Any]:
    text = result.stdout.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    release = next(
        (ln for ln in lines if "release" in ln.lower() or "version" in ln.lower()), lines[-1] if lines else ""
    )
    return {"status": result.status, "reason": result.reason, "version": release.strip()}
