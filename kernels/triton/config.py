"""Launch configurations shared by the Triton kernels of this directory, per GPU backend.

``num_warps`` counts hardware warps: 32 threads on NVIDIA, a 64-thread wavefront on AMD. Elementwise
kernels autotune over a small list (the best block differs by dtype and device: on an H100, 8 KiB per
program with 16 warps for fp32, 8-16 KiB for bf16; autotuning happens in the first call, which the
benchmark reports separately). Softmax picks its blocks from the row width with the table below, written
in threads and converted with the device's warp size, so both backends get the same elements per thread.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import triton


@dataclass(frozen=True)
class Target:
    backend: str  # "cuda" | "hip" | "interpreter"
    warp_size: int


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def current_target() -> Target:
    """Backend and warp size of the active device; cached, as every launch asks and the device is fixed."""
    if interpreted():
        # The interpreter runs kernels on the CPU (used by the tests); lay them out as for NVIDIA.
        return Target(backend="interpreter", warp_size=32)
    target = triton.runtime.driver.active.get_current_target()
    return Target(backend=str(target.backend), warp_size=int(getattr(target, "warp_size", 32)))


# (BLOCK_SIZE, num_warps): 4 to 32 elements per thread; (512, 4) and (1024, 4) are PyTorch's and
# Inductor's choices for large pointwise ops. On a 64-wide wavefront the same num_warps is
# twice the threads; 16 warps is still within AMD's 1024-thread limit.
ELEMENTWISE_SHAPES = ((512, 4), (1024, 4), (2048, 8), (2048, 16), (4096, 8), (4096, 16), (8192, 16))
# The interpreter (tests) and explicit overrides use this one without autotuning.
ELEMENTWISE_DEFAULT = (2048, 16)


def elementwise_configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for block, warps in ELEMENTWISE_SHAPES]


def quick_bench(kernel_call, quantiles):
    """Autotuning benchmark: short (5 ms warm-up, 25 ms of repetitions) since seven configs are tried
    per tensor size and dtype; differences between configs are a few percent, above its noise."""
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def needs_64bit_offsets(n_elements: int) -> bool:
    """int32 offsets overflow past 2^31 elements; below that they are cheaper."""
    return n_elements + max(b for b, _ in ELEMENTWISE_SHAPES) >= 2**31


@dataclass(frozen=True)
class SoftmaxConfig:
    program_elems: int  # elements a program holds when several short rows share one program
    max_fused_cols: int  # widest row kept in registers in one pass; wider rows use the looped kernel
    elems_per_thread: int  # sets num_warps from the block size
    max_threads: int

    def num_warps(self, block_elems: int, warp_size: int) -> int:
        threads = min(self.max_threads, max(warp_size, block_elems // self.elems_per_thread))
        return max(1, triton.next_power_of_2(threads // warp_size))

    def looped_block(self, itemsize: int) -> int:
        # Measured on an H100 at 4096x16384: 8192 columns per step for fp32, 4096 for 16-bit types.
        return 8192 if itemsize >= 4 else 4096


# Measured on an H100 (sweep of rows per program x warps at 16384x1024, 65536x256, 4096x16384): about
# 2048 elements per program at 16 per thread for short rows, one row per program with 1024 threads
# (16384 columns) for wide ones.
SOFTMAX = {
    "cuda": SoftmaxConfig(program_elems=2048, max_fused_cols=16384, elems_per_thread=16, max_threads=1024),
    "hip": SoftmaxConfig(program_elems=2048, max_fused_cols=16384, elems_per_thread=16, max_threads=1024),
}


def softmax_config(target: Target | None = None) -> SoftmaxConfig:
    target = target or current_target()
    return SOFTMAX.get(target.backend, SOFTMAX["cuda"])
