"""GeLU (tanh approximation) in Triton, in the style of the Triton tutorials."""

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
def gelu_kernel(x_ptr, y_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    if OFFSETS_64:
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    inner = 0.79788456 * (x + 0.044715 * x * x * x)
    # 0.5 * (1 + tanh(a)) == 1 / (1 + exp(-2a)): one exp, and it saturates cleanly for large |a|
    # where the tutorial's (exp(2a) - 1) / (exp(2a) + 1) becomes inf / inf = NaN.
    y = x / (1.0 + tl.exp(-2.0 * inner))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(
    x: torch.Tensor, out: torch.Tensor | None = None, *, block_size: int | None = None, num_warps: int | None = None
) -> torch.Tensor:
    """GeLU of a contiguous GPU tensor; ``out`` (same shape and dtype) is written when given.

    The block size is autotuned per size and dtype on the first call unless ``block_size`` /
    ``num_warps`` pin it.
    """
    if not x.is_contiguous():
        raise ValueError("gelu: x must be contiguous")
    y = elementwise_out("gelu", x, out)
    launch_elementwise(gelu_kernel, (x, y), y.numel(), block_size, num_warps)
    return y


def warm_gelu(shape: tuple[int, ...], dtype: torch.dtype, target: Target) -> None:
    """Compile what :func:`gelu` autotunes over for this shape and dtype on ``target``, launching nothing."""
    warm_elementwise(gelu_kernel, 2, dtype, math.prod(shape), target)
