"""HIP C++ device code compiled with hipcc for AMD architectures, resources read from the assembly."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpulab.bench.ops import OPS
from gpulab.kernel_compile.archs import Arch
from gpulab.kernel_compile.resources import amdgcn_kernels, demangle
from gpulab.paths import HIP_SOURCES, PACKAGE_DIR, kernel_relpath

HIPCC_FLAGS = ("-O3", "-std=c++17", "--cuda-device-only", "-S")
DTYPES = (("bfloat16", "bf16"), ("__half", "fp16"), ("half", "fp16"), ("c10::Half", "fp16"), ("float", "fp32"))
MAX_MESSAGE = 2000


def hip_sources() -> list[Path]:
    """The HIP translation units (gpulab.paths.HIP_SOURCES), each compiled and tabled for every AMD arch; its
    directory's headers are part of its cache key."""
    return [PACKAGE_DIR / s for s in HIP_SOURCES]


def _with_headers(source: Path) -> list[Path]:
    """The source and the headers beside it: what its compile (and cache key) depends on."""
    return sorted({source, *source.parent.glob("*.h"), *source.parent.glob("*.cuh")})


def hip_inputs() -> list[str]:
    """Every file the HIP compiles read, for the rule's input."""
    return sorted({str(p) for source in hip_sources() for p in _with_headers(source)})


def hipcc_version(hipcc: str) -> str:
    out = subprocess.run([hipcc, "--version"], capture_output=True, text=True, check=False, env=_env()).stdout
    match = re.search(r"clang version (\S+)", out)
    return f"hipcc (clang {match.group(1)})" if match else "hipcc"


def _env() -> dict[str, str]:
    # Debian's hipcc needs the platform named; without a GPU it cannot detect it.
    return {**os.environ, "HIP_PLATFORM": "amd"}


def _digest(source: Path, a: Arch, compiler: str) -> str:
    h = hashlib.sha256(json.dumps([compiler, a.name, HIPCC_FLAGS]).encode())
    for path in _with_headers(source):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:24]


def compile_source(source: Path, a: Arch, cache_dir: Path) -> list[dict[str, Any]]:
    """Rows for every kernel of one HIP source on one AMD arch; one skipped/failed row if it cannot."""
    base = {"source": kernel_relpath(source), "variant": " ".join(HIPCC_FLAGS)}
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        return [{**base, "status": "skipped", "reason": "hipcc is not installed"}]
    compiler = hipcc_version(hipcc)
    path = cache_dir / a.name / f"hip-{source.stem}-{_digest(source, a, compiler)}.json"
    if path.is_file():
        return [{**row, "cached": True} for row in json.loads(path.read_text())]
    rows = [{**base, **row, "compiler": compiler, "cached": False} for row in _compile(hipcc, source, a)]
    if all(r["status"] != "failed" for r in rows):  # a failure may be passing trouble: compile again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([{k: v for k, v in r.items() if k != "cached"} for r in rows]))
        tmp.replace(path)
    return rows


def _compile(hipcc: str, source: Path, a: Arch) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gpulab-hipcc-") as tmp:
        asm_path = Path(tmp) / "device.s"
        cmd = [hipcc, f"--offload-arch={a.name}", *HIPCC_FLAGS, "-o", str(asm_path), str(source)]
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_env(), cwd=source.parent)
        seconds = time.perf_counter() - start
        if result.returncode != 0 or not asm_path.is_file():
            return [_refusal(result.stderr, a, seconds)]
        kernels = amdgcn_kernels(asm_path.read_text())
    return [_kernel_row(symbol, figures, seconds) for symbol, figures in kernels.items()]


def _refusal(stderr: str, a: Arch, seconds: float) -> dict[str, Any]:
    """An arch the installed compiler does not know (or lacks device libraries for) is skipped, with its
    words; any other error is a failed compile."""
    errors = [line for line in stderr.splitlines() if "error" in line] or stderr.strip().splitlines()[-5:]
    message = "\n".join(errors)[:MAX_MESSAGE]
    unsupported = "invalid target ID" in message or "cannot find ROCm device library" in message
    status = "skipped" if unsupported else "failed"
    return {"status": status, "reason": f"hipcc --offload-arch={a.name}: {message}", "compile_s": seconds}


def _kernel_row(symbol: str, figures: dict[str, Any], seconds: float) -> dict[str, Any]:
    name = demangle(symbol)
    short = re.sub(r"^void\s+", "", name.split("(", 1)[0])  # gpulab::kernels::softmax_warp_kernel<float, 32>
    lower = name.lower()
    op = next((o for o in sorted(OPS, key=len, reverse=True) if o in short.lower()), "")  # longest name first
    dtype = next((d for token, d in DTYPES if token.lower() in lower), "")
    figures = {k: v for k, v in figures.items() if k != "compiler_waves_per_simd"}
    # Occupancy at the kernel's launch bound (the largest workgroup it may be launched with).
    threads = figures.pop("max_flat_workgroup_size")
    return {"status": "ok", "kernel": short, "op": op, "dtype": dtype, "compile_s": seconds, "threads": threads,
            **figures}
