"""One architecture's job of rule kernels_compile: every Triton launch and every HIP source, one table."""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.parallel import run_all
from gpulab.core.paths import kernel_relpath
from gpulab.toolchains import KERNEL_RESOURCES
from gpulab.toolchains.archs import Arch, arch, occupancy


def default_cache_dir() -> Path:
    from gpulab.core.paths import default_cache_root

    return default_cache_root() / "kernel_compile"


def vector_elements(sizes: Any) -> tuple[int, ...]:
    """Element counts the benchmark launches its vector ops (gelu, add) at on a GPU: its auto sizes, plus configured
    ones."""
    from gpulab.bench.sizes import GPU_VECTOR
    from gpulab.core.ops import OPS, parse_shape

    counts = set(GPU_VECTOR)
    if isinstance(sizes, dict):
        for op in (name for name, spec in OPS.items() if spec.ndim == 1):
            counts |= {OPS[op].numel(parse_shape(op, value)) for value in sizes.get(op, [])}
    return tuple(sorted(counts))


Task = Callable[[], list[dict[str, Any]]]  # one compile: its table rows


def triton_tasks(a: Arch, dtypes: tuple[str, ...], sizes: Any, cache_dir: Path, stack: ExitStack) -> list[Task]:
    """One task per Triton launch, to run inside ``stack`` (a throw-away Triton cache, see private_triton_cache)."""
    if importlib.util.find_spec("triton") is None:
        return [lambda: [{"status": "skipped", "reason": "Triton is not installed", "compiler": "triton"}]]
    from gpulab.kernels.triton.launches import launches
    from gpulab.toolchains.triton_aot import cached_path, compile_launch, compiler_name, private_triton_cache

    todo = launches(a.target, dtypes, vector_elements(sizes))
    compiler = compiler_name(a)
    stack.enter_context(private_triton_cache())
    if not all(cached_path(launch, a, cache_dir).is_file() for launch in todo):
        # The first compile of a process loads the backend: not timed, and done before the workers fork, so
        # each of them starts with the backend loaded.
        compile_launch(todo[0], a)
    return [partial(_triton_row, launch, a, cache_dir, compiler) for launch in todo]


def _triton_row(launch: Any, a: Arch, cache_dir: Path, compiler: str) -> list[dict[str, Any]]:
    from gpulab.toolchains.triton_aot import compile_cached

    return [{
        "compiler": compiler,
        "source": kernel_relpath(launch.kernel.fn.__code__.co_filename),
        "op": launch.op, "kernel": launch.kernel.__name__, "variant": launch.variant,
        "dtype": launch.dtype, "num_warps": launch.num_warps, **compile_cached(launch, a, cache_dir),
    }]


def hip_tasks(a: Arch, cache_dir: Path) -> list[Task]:
    """Every HIP source with clang, and with Debian's hipcc too where its device libraries cover the arch."""
    from gpulab.toolchains.hipcc import hip_sources, hipcc_covers

    kinds = ("clang", "hipcc") if hipcc_covers(a) else ("clang",)
    tasks = [partial(_hip_rows, partial(compile_source_of, source, kind), a, cache_dir)
             for source in hip_sources() for kind in kinds]
    return [partial(_hip_rows, compile_extension, a, cache_dir), *tasks]


def compile_source_of(source: Path, kind: str, a: Arch, cache_dir: Path) -> list[dict[str, Any]]:
    from gpulab.toolchains.hipcc import compile_source

    return compile_source(source, a, cache_dir, kind)


def compile_extension(a: Arch, cache_dir: Path) -> list[dict[str, Any]]:
    """The extension's GPU unit hipified and compiled with PyTorch's ROCm flags (rocm_extension), by clang."""
    from gpulab.toolchains import rocm_extension
    from gpulab.toolchains.hipcc import CLANG, compile_source

    if importlib.util.find_spec("torch") is None:
        return [{"status": "skipped", "source": rocm_extension.NAME, "compiler": CLANG,
                 "reason": "PyTorch is not installed (its hipify and ROCm build flags are used): pip install torch"}]
    import torch

    with tempfile.TemporaryDirectory(prefix="gpulab-hipify-") as tmp:
        unit = rocm_extension.hipify(Path(tmp))
        return compile_source(unit, a, cache_dir, "clang", name=rocm_extension.NAME,
                              flags=rocm_extension.device_flags(a.name), key=f"torch {torch.__version__}")


def _hip_rows(compile_rows: Callable[[Arch, Path], list[dict[str, Any]]], a: Arch,
              cache_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for row in compile_rows(a, cache_dir):
        threads = row.pop("threads", None)
        if threads:
            row["num_warps"] = -(-threads // a.warp_size)
        rows.append(row)
    return rows


def with_arch_figures(row: dict[str, Any], a: Arch) -> dict[str, Any]:
    """Add the arch's columns and, for a compiled kernel, its occupancy."""
    row = {"arch": a.name, "family": a.family, "backend": a.backend, "warp_size": a.warp_size, "unit": a.unit,
           "max_warps_per_unit": a.max_warps_per_unit, **row}
    if row["status"] == "ok" and row.get("num_warps"):
        row["threads"] = row["num_warps"] * a.warp_size
        warps, limiter = occupancy(a, row["registers"], row["num_warps"], row["lds_bytes"], row.get("sgprs") or 0)
        row.update(warps_per_unit=warps, occupancy=warps / a.max_warps_per_unit, occupancy_limiter=limiter)
    return row


def compile_arch(
    name: str,
    dtypes: tuple[str, ...],
    *,
    target: str,
    fingerprint: str,
    sizes: Any = "auto",
    cache_dir: Path | None = None,
    workers: int = 1,
) -> pd.DataFrame:
    """The table of one architecture: every Triton launch (for the benchmark's ``bench.sizes``), and on AMD
    every HIP source; ``workers`` compiles at a time (gpulab.core.jobenv.cpu_workers), each in its own process."""
    a = arch(name)
    cache_dir = cache_dir or default_cache_dir()
    start = time.perf_counter()
    with ExitStack() as stack:
        # The HIP translation units (seconds each) start first, so the short Triton compiles fill in beside them.
        hip = hip_tasks(a, cache_dir) if a.backend == "hip" else []
        tasks = hip + triton_tasks(a, tuple(dtypes), sizes, cache_dir, stack)
        results = run_all(tasks, workers)
        # Rows in the table's usual order: Triton launches, then HIP kernels.
        rows = [row for task_rows in results[len(hip):] + results[:len(hip)] for row in task_rows]
    rows = [{"target": target, "fingerprint": fingerprint, **with_arch_figures(r, a)} for r in rows]
    print(f"{name}: {len(rows)} rows in {time.perf_counter() - start:.1f} s, {workers} compile(s) at a time")
    return KERNEL_RESOURCES.frame(rows)
