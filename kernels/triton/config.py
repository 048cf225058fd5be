"""Launch configurations shared by the Triton kernels of this directory, per architecture family.

``num_warps`` counts hardware warps (32 threads on NVIDIA and RDNA, 64 on CDNA). The running device's family picks
the elementwise autotune list and the softmax table, which ``gpulab.toolchains`` compiles ahead of time for every
listed architecture (``tests/test_kernels_compile.py``: no spills, at least half occupancy); softmax's blocks are
written in threads, so every family gets the same elements per thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import triton


@dataclass(frozen=True)
class Target:
    backend: str  # "cuda" | "hip" | "interpreter"
    warp_size: int
    arch: str = ""  # gfx1151 / sm_90; empty for the interpreter
    # SMs (NVIDIA) or CUs (AMD) of the running device; 0 where no device is known (ahead-of-time targets, the
    # interpreter). Bounds the split softmax, whose programs wait for each other (softmax.launch_choice).
    units: int = 0

    @property
    def family(self) -> str:
        """nvidia (and the interpreter) | cdna (AMD wave64: gfx9) | rdna (AMD wave32: gfx10-12)."""
        if self.backend == "hip":
            return "rdna" if self.warp_size == 32 else "cdna"
        return "nvidia"


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# Triton's backend of each of gpulab.core.device's GPU backends.
TRITON_BACKENDS = {"cuda": "cuda", "rocm": "hip"}


@functools.cache
def current_target() -> Target:
    """Backend and warp size of the active device, as gpulab.core.device detects it; cached, as every launch asks
    and the device is fixed."""
    if interpreted():
        # The interpreter runs kernels on the CPU (used by the tests); lay them out as for NVIDIA.
        return Target(backend="interpreter", warp_size=32)
    from gpulab.core.device import detect

    return target_of(detect())


def target_of(info: Any) -> Target:
    """The Triton target of a detected device (:class:`gpulab.core.device.DeviceInfo`): from
    :func:`gpulab.core.device.probe`, it lets a job compile for the device before claiming it."""
    if not info.gpu_available:
        raise RuntimeError(f"Triton kernels need a GPU or TRITON_INTERPRET=1: {info.reason}")
    return Target(backend=TRITON_BACKENDS[info.backend], warp_size=info.warp_size, arch=info.arch or "",
                  units=info.multiprocessor_count)


@contextlib.contextmanager
def parallel_compile() -> Iterator[None]:
    """Kernels warmed up inside the block (``kernel.warmup``) compile in a thread pool, one thread a core, and the
    block ends when all are compiled (``triton.AsyncCompileMode``; where this Triton lacks it, each compiles as it
    is warmed up). An autotuned kernel's first launch otherwise compiles its configurations one after another."""
    mode = getattr(triton, "AsyncCompileMode", None)
    if mode is None or interpreted():
        yield
        return
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool, mode(pool):
        yield


def launch_pdl(target: Target | None = None) -> bool:
    """Whether the decode kernels launch as programmatic dependents on ``target`` (default: the running device;
    Hopper and newer NVIDIA GPUs): each may start while the kernel before it drains, and waits in ``gdc_wait``
    before reading what that kernel wrote."""
    target = target or current_target()
    return target.backend == "cuda" and target.arch.startswith("sm_") and int(target.arch[3:].rstrip("a")) >= 90


# (BLOCK_SIZE, num_warps): 4 to 32 elements per thread; (512, 4) and (1024, 4) are PyTorch's and
# Inductor's choices for large pointwise ops. Measured on an H100 (32-thread warps). Each family keeps
# the same threads per block and elements per thread: RDNA's wave32 takes the list as it is, CDNA's
# 64-thread wavefronts halve num_warps (otherwise a block would hold twice the threads and half the
# elements per thread: (512, 4) would load 2 fp32 per thread, below one 16-byte vector). The compiled
# table (build/kernel_resources.csv) shows none of these spills or falls below half occupancy on gfx1151,
# gfx1100, gfx942, gfx90a, sm_90 or sm_80; speed on AMD is not measured yet.
_NVIDIA_ELEMENTWISE = ((512, 4), (1024, 4), (2048, 8), (2048, 16), (4096, 8), (4096, 16), (8192, 16))
ELEMENTWISE_SHAPES = {
    "nvidia": _NVIDIA_ELEMENTWISE,
    "rdna": _NVIDIA_ELEMENTWISE,
    "cdna": tuple((block, warps // 2) for block, warps in _NVIDIA_ELEMENTWISE),
}
# The autotune decorator is built at import, before the device is known: it holds every family's shapes
# and prunes them to the running family's at the first launch (prune_to_family).
ELEMENTWISE_CANDIDATES = tuple(dict.fromkeys(s for shapes in ELEMENTWISE_SHAPES.values() for s in shapes))
# The interpreter (tests) and explicit overrides use this one without autotuning.
ELEMENTWISE_DEFAULT = (2048, 16)


def elementwise_shapes(target: Target | None = None) -> tuple[tuple[int, int], ...]:
    """The (BLOCK_SIZE, num_warps) pairs the family of ``target`` (default: the running device) tries."""
    return ELEMENTWISE_SHAPES[(target or current_target()).family]


def elementwise_configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for block, warps in ELEMENTWISE_CANDIDATES]


def prune_to_family(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    chosen = set(elementwise_shapes())
    return [c for c in configs if (c.kwargs["BLOCK_SIZE"], c.num_warps) in chosen]


ELEMENTWISE_PRUNE = {"early_config_prune": prune_to_family}


def quick_bench(kernel_call, quantiles):
    """Autotuning benchmark: short (5 ms warm-up, 25 ms of repetitions) since seven elementwise configs are tried
    per tensor size and dtype, and 19 GEMV configs per product shape; differences between configs are a few
    percent, above its noise."""
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def needs_64bit_offsets(n_elements: int) -> bool:
    """int32 offsets overflow past 2^31 elements; below that they are cheaper."""
    return n_elements + max(b for b, _ in ELEMENTWISE_CANDIDATES) >= 2**31


def elementwise_out(name: str, x: Any, out: Any) -> Any:
    """The output tensor of an elementwise kernel over ``x``: ``out`` when given, checked, else a new one."""
    y = x.new_empty(x.shape) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"{name}: out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    return y


def launch_elementwise(kernel: Any, args: tuple, n_elements: int, block_size: int | None,
                       num_warps: int | None) -> None:
    """Launch an autotuned elementwise kernel (``kernel(*args, n_elements, OFFSETS_64, BLOCK_SIZE)``) over
    ``n_elements``. A pinned block size or warp count, or the interpreter, calls the jitted kernel under the
    autotuner directly, with the default for what is not pinned."""
    if n_elements == 0:
        return
    wide = needs_64bit_offsets(n_elements)
    if block_size or num_warps or interpreted():
        block = block_size or ELEMENTWISE_DEFAULT[0]
        kernel.fn[(triton.cdiv(n_elements, block),)](
            *args, n_elements, OFFSETS_64=wide, BLOCK_SIZE=block, num_warps=num_warps or ELEMENTWISE_DEFAULT[1])
    else:
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731 - the tutorials' idiom
        kernel[grid](*args, n_elements, OFFSETS_64=wide)


def warm_elementwise(kernel: Any, pointers: int, dtype: Any, n_elements: int, target: Target) -> None:
    """Compile, launching nothing, every configuration the autotuner of an elementwise kernel
    (``kernel(*pointers, n_elements, OFFSETS_64, BLOCK_SIZE)``) tries on ``target``'s family for this size and torch
    dtype. Pointers are given as their dtype (Triton's ``warmup`` takes them for aligned tensors), so no memory is
    touched and the device need not be claimed; the timed launch then finds the kernels compiled."""
    if n_elements == 0 or interpreted():
        return
    chosen = set(elementwise_shapes(target))
    wide = needs_64bit_offsets(n_elements)
    for config in kernel.configs:
        if (config.kwargs["BLOCK_SIZE"], config.num_warps) in chosen:
            kernel.fn.warmup(*[dtype] * pointers, n_elements, OFFSETS_64=wide, **config.all_kwargs(), grid=(1,))


def elementwise_label(block_size: int, num_warps: int) -> str:
    return f"BLOCK_SIZE={block_size} num_warps={num_warps}"


def launched_shape(kernel: Any) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) of the last unpinned launch of an autotuned elementwise kernel: the autotuner's
    pick for that size and dtype (``best_config``, which every launch through the autotuner sets), or the
    default the interpreter runs."""
    if interpreted():
        return ELEMENTWISE_DEFAULT
    config = kernel.best_config
    return int(config.kwargs["BLOCK_SIZE"]), int(config.num_warps)


@dataclass(frozen=True)
class SoftmaxConfig:
    program_elems: int  # elements a program holds when several short rows share one program
    max_fused_cols: int  # widest row (or split chunk) one program keeps in registers
    elems_per_thread: int  # sets num_warps from the block size
    max_threads: int
    split_elems: int = 8192  # columns per program of the split kernel (rows wider than max_fused_cols)
    split_elems_per_thread: int = 32

    def num_warps(self, block_elems: int, warp_size: int, elems_per_thread: int | None = None) -> int:
        threads = min(self.max_threads, max(warp_size, block_elems // (elems_per_thread or self.elems_per_thread)))
        return max(1, triton.next_power_of_2(threads // warp_size))

    def rows_per_program(self, block_n: int) -> int:
        return max(1, self.program_elems // block_n)

    def looped_block(self, itemsize: int) -> int:
        # Measured on an H100 at 4096x16384: 8192 columns per step for fp32, 4096 for 16-bit types.
        return 8192 if itemsize >= 4 else 4096


# The fastest launches of the H100 sweeps (docs/decisions.md, "Softmax launches"); the AMD families take the same.
SOFTMAX = {
    "nvidia": SoftmaxConfig(program_elems=2048, max_fused_cols=16384, elems_per_thread=16, max_threads=1024),
    "cdna": SoftmaxConfig(program_elems=2048, max_fused_cols=16384, elems_per_thread=16, max_threads=1024),
    "rdna": SoftmaxConfig(program_elems=2048, max_fused_cols=16384, elems_per_thread=16, max_threads=1024),
}


def softmax_config(target: Target | None = None) -> SoftmaxConfig:
    return SOFTMAX[(target or current_target()).family]
