"""Ahead-of-time Triton compiles of kernels/triton/ for an architecture that need not be present."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulab.toolchains.archs import Arch
from gpulab.toolchains.resources import amdgcn_kernels, elf_section_size, ptxas_resources

MAX_MESSAGE = 2000  # characters of a compiler error kept in the table


def gpu_target(a: Arch) -> Any:
    from triton.backends.compiler import GPUTarget

    arch = int(a.name.removeprefix("sm_")) if a.backend == "cuda" else a.name
    return GPUTarget(a.backend, arch, a.warp_size)


def compiler_name(a: Arch) -> str:
    """triton <version>, with the ptxas it drives for NVIDIA (the wheel's own unless TRITON_PTXAS_PATH)."""
    import triton

    if a.backend != "cuda":
        return f"triton {triton.__version__}"
    from triton.backends.nvidia.compiler import get_ptxas

    return f"triton {triton.__version__} (ptxas {get_ptxas(int(a.name.removeprefix('sm_'))).version})"


def cache_key(launch: Any, a: Arch) -> str:
    """Digest of everything the compiled code depends on: the kernel source and the Triton functions it
    calls (JITFunction.cache_key), Triton's version, the signature, constants, attributes and the target."""
    import triton

    parts = [triton.__version__, launch.kernel.cache_key, launch.signature, sorted(launch.constexprs.items()),
             sorted(launch.attrs(a.backend).items()), launch.num_warps, a.name, a.warp_size]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


@contextlib.contextmanager
def private_triton_cache() -> Iterator[None]:
    """Every compile cold (always_compile) into a throw-away Triton cache, so compile seconds are honest and
    ~/.triton stays untouched; ptxas's -v log printed, so its resource lines can be read."""
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="gpulab-triton-") as tmp:
        saved = knobs.cache.dir, knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
        knobs.cache.dir, knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = tmp, True, True
        try:
            yield
        finally:
            knobs.cache.dir, knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved


def compile_launch(launch: Any, a: Arch) -> dict[str, Any]:
    """Compile one launch; its resources, or status failed with the compiler's message."""
    import triton
    from triton.compiler import ASTSource

    src = ASTSource(launch.kernel, launch.signature, launch.constexprs, launch.attrs(a.backend))
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=gpu_target(a), options={"num_warps": launch.num_warps})
    except Exception as exc:  # every compiler error (Triton, LLVM, ptxas) is a recorded outcome
        message = f"{type(exc).__name__}: {exc}".strip()
        return {"status": "failed", "reason": message[:MAX_MESSAGE], "compile_s": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    figures = _figures(compiled, a, log.getvalue())
    return {"status": "ok", "compile_s": seconds, **figures}


def _figures(compiled: Any, a: Arch, ptxas_log: str) -> dict[str, Any]:
    name = compiled.metadata.name
    shared = int(compiled.metadata.shared)
    if a.backend == "hip":
        kernels = amdgcn_kernels(compiled.asm["amdgcn"])
        figures = dict(kernels[name])
        for note in ("compiler_waves_per_simd", "max_flat_workgroup_size", "wavefront_size"):
            figures.pop(note)
        figures["lds_bytes"] = max(figures["lds_bytes"], shared)
        return figures
    figures = ptxas_resources(ptxas_log)
    figures["sgprs"] = None
    figures["lds_bytes"] = shared
    figures["code_bytes"] = elf_section_size(compiled.asm["cubin"], f".text.{name}")
    return figures


def cached_path(launch: Any, a: Arch, cache_dir: Path) -> Path:
    return cache_dir / a.name / f"{launch.kernel.__name__}-{cache_key(launch, a)}.json"


def compile_cached(launch: Any, a: Arch, cache_dir: Path) -> dict[str, Any]:
    """compile_launch, reusing the stored outcome of an identical earlier compile (``cached`` says so;
    its compile_s is the cold compile's)."""
    path = cached_path(launch, a, cache_dir)
    if path.is_file():
        return {**json.loads(path.read_text()), "cached": True}
    row = compile_launch(launch, a)
    if row["status"] == "ok":  # a failure is compiled again next time, with the compiler's message fresh
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(row))
        tmp.replace(path)
    return {**row, "cached": False}
