"""The simplest kernels of each memory-access pattern, for the measured bandwidth ceilings.

``read`` (one read: a block-wise sum), ``copy`` (one read, one write) and ``add`` (two reads, one write),
each launched with an explicit block size and warp count so ``gpulab.core.ceilings`` can sweep a few
configurations and keep the best. No autotuning here: the sweep is the caller's, and every configuration
it tries is recorded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import Target, current_target, elementwise_shapes, softmax_config


def sweep(target: Target | None = None) -> tuple[tuple[int, int], ...]:
    """(block size, warps) tried for each pattern: every launch shape the benchmarked kernels take on the device's
    family, so no kernel of the matrix has a launch shape the ceiling did not try at its best. The elementwise
    kernels' autotuning list (which holds PyTorch's (1024, 4), the C++ extension's 128 threads x 8 elements too),
    and the softmax kernels' programs as 1-D tiles: a short-row program (``program_elems`` at ``elems_per_thread``),
    a widest fused row (``max_fused_cols`` over ``max_threads``) and a split chunk."""
    target = target or current_target()
    softmax = softmax_config(target)
    tiles = ((softmax.program_elems, None), (softmax.max_fused_cols, None),
             (softmax.split_elems, softmax.split_elems_per_thread))
    from_softmax = tuple((elems, softmax.num_warps(elems, target.warp_size, per_thread)) for elems, per_thread in tiles)
    return tuple(dict.fromkeys((*elementwise_shapes(target), *from_softmax)))



@triton.jit
def _offsets(n_elements, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    if OFFSETS_64:
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    return offsets, offsets < n_elements


@triton.jit
def read_kernel(x_ptr, partial_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr):
    offsets, mask = _offsets(n_elements, OFFSETS_64, BLOCK)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tl.program_id(axis=0), tl.sum(x, axis=0))


@triton.jit
def copy_kernel(x_ptr, out_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr):
    offsets, mask = _offsets(n_elements, OFFSETS_64, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr):
    offsets, mask = _offsets(n_elements, OFFSETS_64, BLOCK)
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def _grid(n: int, block: int) -> tuple[int]:
    return (triton.cdiv(n, block),)


def _wide(n: int, block: int) -> bool:
    return triton.cdiv(n, block) * block >= 2**31


def read(x: torch.Tensor, partial: torch.Tensor, block: int, warps: int) -> torch.Tensor:
    """Per-block float32 sums of ``x`` into ``partial`` (``cdiv(numel, block)`` elements)."""
    n = x.numel()
    read_kernel[_grid(n, block)](x, partial, n, OFFSETS_64=_wide(n, block), BLOCK=block, num_warps=warps)
    return partial


def copy(x: torch.Tensor, out: torch.Tensor, block: int, warps: int) -> torch.Tensor:
    n = x.numel()
    copy_kernel[_grid(n, block)](x, out, n, OFFSETS_64=_wide(n, block), BLOCK=block, num_warps=warps)
    return out


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, block: int, warps: int) -> torch.Tensor:
    n = x.numel()
    add_kernel[_grid(n, block)](x, y, out, n, OFFSETS_64=_wide(n, block), BLOCK=block, num_warps=warps)
    return out
