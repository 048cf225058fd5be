"""The standalone HIP vector-add program (``kernels/hip/vector_add.hip``): build it, run it, record both.

The compiler follows the machine (:func:`gpulab.core.tools.find_compiler`): hipcc where PyTorch is a ROCm build,
nvcc through ``hip_compat.h`` where it is a CUDA build, on a CPU-only machine hipcc if installed, else nvcc. The
build is always recorded; without a GPU of that kind the run is recorded as skipped with both reasons.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.core.device import DeviceInfo, detect, offload_archs, probe
from gpulab.core.paths import HIP_PROGRAM, PACKAGE_DIR, default_cache_root
from gpulab.core.tables import Column, TableSchema, write_atomic
from gpulab.core.timing import TimingSettings, flush_bytes, is_stable, summarize
from gpulab.core.tools import ToolResult, find_compiler, run_tool

SOURCE = PACKAGE_DIR / HIP_PROGRAM
BYTES_PER_ELEMENT = 3 * 4  # two float32 reads and one write
# Debian's hipcc wraps clang and needs to be told the platform; real ROCm installs accept it too.
HIPCC_ENV = {"HIP_PLATFORM": "amd"}

HIP_STANDALONE = TableSchema(
    "hip_standalone",
    (
        Column("phase", "str", "build | run"),
        Column("compiler", "str", "hipcc | nvcc"),
        Column("compiler_version", "str", "the compiler's version line"),
        Column("command", "str", "the full compile command"),
        Column("arch", "str", "architecture compiled for (gfx90a, sm_90; nvcc-default when none was known)"),
        Column("build_s", "float", "wall time of the compile, build rows"),
        Column("binary_bytes", "int", "size of the program, build rows"),
        Column("device_name", "str", "GPU the program ran on, run rows"),
        Column("size", "int", "vector length in float32 elements, run rows"),
        Column("correct", "bool",
               "every element equals the host's a + b, after the first call and again after timing"),
        Column("mismatches", "int", "elements that differed"),
        Column("kernel_ms", "float", "median kernel time (device events)"),
        Column("gbps", "float", "12 bytes per element (2 reads + 1 write) over the median time"),
        Column("log_file", "str", "raw output of the phase, next to this table"),
    ),
    measured=True,
    path="build/hip_standalone.csv",
)


@dataclass(frozen=True)
class StandalonePlan:
    compiler: str  # hipcc | nvcc
    path: str
    arch: str  # gfx90a / sm_90 / nvcc-default
    runs_here: bool  # a GPU of the compiler's kind is visible to the device detector
    no_gpu_reason: str


def plan_standalone(
    info: DeviceInfo, pinned: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
    toolkit_dirs: bool = True,
) -> tuple[StandalonePlan | None, str]:
    """Which compiler and arch build the program on this machine, or (None, why none can)."""
    env = os.environ if environ is None else environ
    hipcc, nvcc = (find_compiler(name, env, toolkit_dirs=toolkit_dirs) for name in ("hipcc", "nvcc"))
    backend = info.build_backend
    if backend == "rocm":
        order = [("hipcc", hipcc)]
    elif backend == "cuda":
        order = [("nvcc", nvcc)]
    else:  # CPU-only PyTorch: the study's toolchain first
        order = [("hipcc", hipcc), ("nvcc", nvcc)]
    found = [(name, exe) for name, exe in order if exe]
    if not found:
        wanted = " or ".join(name for name, _ in order)
        why = f"no compiler: {wanted} not found (PATH and the toolkit directories searched)"
        if backend != "cpu":
            why += f" (PyTorch is a {backend.upper() if backend == 'rocm' else 'CUDA'} build)"
        return None, why
    compiler, exe = found[0]
    pinned = list(pinned or [])
    if compiler == "hipcc":
        gfx = [a for a in pinned if a.startswith("gfx")]
        # offload_archs: the detected GPU, else HSA_OVERRIDE_GFX_VERSION, else gfx90a without a GPU.
        arch = gfx[0] if gfx else offload_archs(info, None, dict(env))[0]
        runs = info.gpu_available and info.backend == "rocm"
        kind = "AMD"
    else:
        sm = [a for a in pinned if a.startswith("sm_")]
        detected = info.arch if info.arch and info.arch.startswith("sm_") else None
        arch = sm[0] if sm else (detected or "nvcc-default")
        runs = info.gpu_available and info.backend == "cuda"
        kind = "NVIDIA"
    reason = "" if runs else f"no {kind} GPU: {info.reason or f'the visible GPU is {info.backend}'}"
    return StandalonePlan(compiler, exe, arch, runs, reason), ""


def compile_command(plan: StandalonePlan, binary: Path, extra_cflags: Sequence[str],
                    source: Path = SOURCE) -> list[str]:
    include = f"-I{source.parent}"
    if plan.compiler == "hipcc":
        return [plan.path, f"--offload-arch={plan.arch}", *extra_cflags, include, "-o", str(binary), str(source)]
    arch = [] if plan.arch == "nvcc-default" else [f"-arch={plan.arch}"]
    # nvcc does not know the .hip suffix: compile it as CUDA, with the portability header.
    return [plan.path, "-x", "cu", "-std=c++17", *arch, *extra_cflags, include, "-o", str(binary), str(source)]


def compiler_version(plan: StandalonePlan) -> str:
    result = run_tool(plan.compiler, [plan.path, "--version"], timeout_s=60,
                      env=HIPCC_ENV if plan.compiler == "hipcc" else None)
    lines = [ln.strip() for ln in (result.stdout or result.stderr).splitlines() if ln.strip()]
    key = "HIP version" if plan.compiler == "hipcc" else "release"
    return next((ln for ln in lines if key in ln), lines[0] if lines else result.reason)


def parse_output(stdout: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The program's DEVICE and RESULT lines."""
    device: dict[str, str] = {}
    results = []
    for line in stdout.splitlines():
        parts = line.strip().split(",")
        if parts[0] == "DEVICE" and len(parts) >= 6:
            device = {"name": parts[1], "arch": parts[2], "warp_size": parts[3], "multiprocessors": parts[4],
                      "runtime": parts[5]}
        elif parts[0] == "RESULT" and len(parts) == 6:
            samples = [float(s) for s in parts[5].split(";") if s]
            results.append({"size": int(parts[1]), "correct": parts[2] == "1", "mismatches": int(parts[3]),
                            "first_call_ms": float(parts[4]), "samples_ms": samples})
    return device, results


def program_args(sizes: Sequence[int], timing: TimingSettings, info: DeviceInfo) -> list[str]:
    # The program flushes as the harness does: twice the device's last-level cache (gpulab.core.timing).
    flush_mib = math.ceil(flush_bytes(info) / 2**20) if timing.flush_cache else 0
    return ["--sizes", ",".join(str(s) for s in sizes), "--min-time-ms", f"{timing.min_time_s * 1e3:g}",
            "--min-reps", str(timing.min_reps), "--max-reps", str(timing.max_reps),
            "--warmup", str(timing.warmup_reps), "--flush-mib", str(flush_mib)]


def _raw(result: ToolResult) -> str:
    return (f"$ {' '.join(result.argv)}\n# status: {result.status}; exit status: {result.exit_status}; "
            f"{result.reason}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def run_standalone(
    *, target: str, fingerprint: str, build_config: Mapping[str, Any], timing: TimingSettings,
    out_csv: Path, build_log: Path, run_log: Path, work_dir: Path | None = None,
    device: DeviceInfo | None = None, environ: Mapping[str, str] | None = None, source: Path = SOURCE,
    timeout_s: float = 900, toolkit_dirs: bool = True,
) -> list[dict[str, Any]]:
    """Build and run the program; write the table and both raw logs; return the rows. The compiler runs before
    the device is claimed (``probe``), the program after (``detect``)."""
    info = device or probe()
    timing = timing.for_device(info)
    sizes = list(build_config.get("standalone_sizes", [1024]))
    flags = list(build_config.get("extra_cflags", ["-O3"]))
    base = {"target": target, "fingerprint": fingerprint}
    build_name, run_name = build_log.name, run_log.name
    plan, why = plan_standalone(info, build_config.get("offload_archs"), environ, toolkit_dirs)
    if plan is None:
        write_atomic(build_log, f"# not built: {why}\n")
        return _not_run(base | {"status": "skipped", "reason": why, "log_file": build_name}, why, sizes, out_csv,
                        run_log)

    work = Path(work_dir or default_cache_root() / "hip_standalone" / target)
    work.mkdir(parents=True, exist_ok=True)
    binary = work / f"vector_add_{plan.compiler}_{plan.arch}"
    binary.unlink(missing_ok=True)  # never run a previous build's binary
    command = compile_command(plan, binary, flags, source)
    version = compiler_version(plan)
    env = HIPCC_ENV if plan.compiler == "hipcc" else None
    start = time.perf_counter()
    built = run_tool(plan.compiler, command, timeout_s=timeout_s, env=env)
    build_s = time.perf_counter() - start
    write_atomic(build_log, f"# {version}\n# {build_s:.2f} s\n" + _raw(built))
    common = {"compiler": plan.compiler, "compiler_version": version, "command": " ".join(command),
              "arch": plan.arch}
    if built.status != "ok" or not binary.is_file():
        failed = {"status": "failed", "reason": f"compile error: {_compile_error(built)}", "build_s": build_s}
        return _not_run(base | common | failed | {"log_file": build_name}, "the build failed", sizes, out_csv,
                        run_log)
    rows = [{**base, **common, "status": "ok", "reason": "", "phase": "build", "build_s": build_s,
             "binary_bytes": binary.stat().st_size, "log_file": build_name}]

    if device is None:
        detect()
    ran = run_tool("vector_add", [str(binary), *program_args(sizes, timing, info)], timeout_s=timeout_s, env=env)
    write_atomic(run_log, _raw(ran))
    rows += _run_rows(ran, plan, sizes, timing, {**base, **common, "phase": "run", "log_file": run_name})
    HIP_STANDALONE.write(rows, out_csv)
    return rows


def _run_rows(ran: ToolResult, plan: StandalonePlan, sizes: list[int], timing: TimingSettings,
              base: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per size from the program's output: measured, or why that size has no result."""
    dev, results = parse_output(ran.stdout)
    by_size = {r["size"]: r for r in results}
    program_said = _first_line(ran.stderr) or ran.reason
    rows = []
    for n in sizes:
        row = {**base, "size": n, "device_name": dev.get("name", "")}
        result = by_size.get(n)
        if result is None and not plan.runs_here:
            row.update(status="skipped", reason=f"{plan.no_gpu_reason}; the program reported: {program_said}")
        elif result is None:
            row.update(status="failed", reason=f"the program stopped before size {n}: {program_said}")
        else:
            row.update(_measured(result, n, timing))
        rows.append(row)
    return rows


def _measured(result: Mapping[str, Any], n: int, timing: TimingSettings) -> dict[str, Any]:
    stats, reps = summarize(result["samples_ms"]), len(result["samples_ms"])
    return dict(
        status="ok" if result["correct"] else "incorrect",
        reason="" if result["correct"] else f"{result['mismatches']} of {n} elements differ from a + b",
        correct=result["correct"], mismatches=result["mismatches"], kernel_ms=stats["median_ms"],
        gbps=BYTES_PER_ELEMENT * n / (stats["median_ms"] / 1e3) / 1e9 if stats["median_ms"] > 0 else math.nan,
        **stats, reps=reps, stable=is_stable(stats["mean_ms"], stats["median_ms"], stats["cv"], reps),
        warmup_reps=timing.warmup_reps,
        first_call_ms=result["first_call_ms"], timer="device_event",
        cache_policy="flush" if timing.flush_cache else "none",
    )


def _not_run(build_row: dict[str, Any], why: str, sizes: list[int], out_csv: Path,
             run_log: Path) -> list[dict[str, Any]]:
    """The build row and a skipped run row per size, written with the run log saying why."""
    run = {k: v for k, v in build_row.items() if k not in ("status", "reason", "build_s", "log_file")}
    rows = [{**build_row, "phase": "build"},
            *({**run, "status": "skipped", "reason": why, "phase": "run", "size": n, "log_file": run_log.name}
              for n in sizes)]
    write_atomic(run_log, f"# not run: {why}\n")
    HIP_STANDALONE.write(rows, out_csv)
    return rows


def _compile_error(result: ToolResult) -> str:
    text = f"{result.stderr}\n{result.stdout}"
    errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
    return (errors[0] if errors else result.reason)[:400]
