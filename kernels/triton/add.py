"""Vector add in Triton, as in the Triton tutorials (autotuned block, 64-bit offsets only when needed)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .config import (
    ELEMENTWISE_PRUNE,
    Target,
    elementwise_configs,
    elementwise_out,
    launch_elementwise,
    quick_bench,
    warm_elementwise,
)

# torch only annotates here: compiling ahead of time (gpulab.toolchains) then does not import it.
if TYPE_CHECKING:
    import torch


@triton.autotune(configs=elementwise_configs(), key=["n_elements"], prune_configs_by=ELEMENTWISE_PRUNE,
                 do_bench=quick_bench)
@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    if OFFSETS_64:
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)


def add(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """x + y for contiguous GPU tensors of one shape and dtype; ``out`` is written when given."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"add: shapes/dtypes differ ({tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype})")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("add: inputs must be contiguous")
    output = elementwise_out("add", x, out)
    launch_elementwise(add_kernel, (x, y, output), output.numel(), block_size, num_warps)
    return output


def warm_add(shape: tuple[int, ...], dtype: torch.dtype, target: Target) -> None:
    """Compile what :func:`add` autotunes over for this shape and dtype on ``target``, launching nothing."""
    warm_elementwise(add_kernel, 3, dtype, math.prod(shape), target)
