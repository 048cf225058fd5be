"""Row softmax of a 2-D tensor in Triton, in the style of the Triton tutorials.

Two kernels: ``softmax_kernel`` keeps whole rows in registers (several short rows per program, so a
65536x256 input still gives each program a few thousand elements) and touches memory once per element
each way; ``softmax_looped_kernel`` handles rows wider than one block with an online max/sum pass
followed by a normalising pass, walked backwards so the row's tail is still in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .config import Target, current_target, softmax_config

# torch only annotates here: compiling ahead of time (gpulab.kernel_compile) then does not import it.
if TYPE_CHECKING:
    import torch


@triton.jit
def softmax_kernel(
    x_ptr, y_ptr, n_rows, n_cols, x_row_stride, y_row_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(axis=0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    rows = rows.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=-float("inf"),
                eviction_policy="evict_first").to(tl.float32)
    row_max = tl.max(x, axis=1)
    numerator = tl.exp(x - row_max[:, None])
    inv_denominator = 1.0 / tl.sum(numerator, axis=1)
    y = numerator * inv_denominator[:, None]
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    x_row_ptr = x_ptr + row * x_row_stride
    y_row_ptr = y_ptr + row * y_row_stride
    # Online softmax kept per lane: a running max and a sum rescaled whenever the max grows, so one
    # pass gives both reductions and no per-iteration cross-lane reduction is needed.
    lane_max = tl.full([BLOCK_N], -float("inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row_ptr + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        # A lane that has only seen -inf keeps a zero sum instead of exp(-inf - -inf) = NaN.
        seen = new_max != -float("inf")
        lane_sum = tl.where(seen, lane_sum * tl.exp(lane_max - new_max) + tl.exp(x - new_max), 0.0)
        lane_max = new_max
    row_max = tl.max(lane_max, axis=0)
    scaled = tl.where(lane_max != -float("inf"), lane_sum * tl.exp(lane_max - row_max), 0.0)
    inv_denominator = 1.0 / tl.sum(scaled, axis=0)
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(0, n_blocks):
        cols = (n_blocks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row_ptr + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
        y = tl.exp(x.to(tl.float32) - row_max) * inv_denominator
        tl.store(y_row_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class SoftmaxLaunch:
    looped: bool  # softmax_looped_kernel (one row per program, BLOCK_N columns per step) or softmax_kernel
    block_m: int  # rows per program (1 for the looped kernel)
    block_n: int
    num_warps: int

    @property
    def label(self) -> str:
        if self.looped:
            return f"looped BLOCK_N={self.block_n} num_warps={self.num_warps}"
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} num_warps={self.num_warps}"

    def overrides(self) -> dict[str, int | None]:
        """The keyword arguments of :func:`softmax` that make exactly this launch."""
        return {"rows_per_program": self.block_m, "num_warps": self.num_warps,
                "looped_block": self.block_n if self.looped else None}


# The tuning sweep's space (gpulab.bench.tune): rows per program from a quarter to four times launch_choice's,
# threads per program as the sweeps that set SOFTMAX measured them, and the looped kernel's blocks for rows at
# least LOOPED_MIN_COLS wide (at 4096x16384 the fused and looped kernels were within a few percent).
TUNE_ROWS_FACTORS = (0.25, 0.5, 1, 2, 4)
TUNE_THREADS = (128, 256, 512, 1024)
TUNE_LOOPED_BLOCKS = (2048, 4096, 8192)
TUNE_LOOPED_THREADS = (256, 512, 1024)
LOOPED_MIN_COLS = 4096


def launch_candidates(n_rows: int, n_cols: int, itemsize: int, target: Target) -> list[SoftmaxLaunch]:
    """Every launch the tuning sweep times for one input, launch_choice's among them. A fused program holds at
    most ``max_fused_cols`` elements (the register budget the family's table gives one wide row) and at least
    one per thread."""
    config, pick = softmax_config(target), launch_choice(n_rows, n_cols, itemsize, target)
    block_n = triton.next_power_of_2(n_cols)
    out = [pick]
    if block_n <= config.max_fused_cols:
        base = pick.block_m if not pick.looped else 1
        for m in sorted({max(1, int(base * f)) for f in TUNE_ROWS_FACTORS}):
            m = min(triton.next_power_of_2(m), triton.next_power_of_2(n_rows))
            for threads in TUNE_THREADS:
                if m * block_n <= config.max_fused_cols and threads <= m * block_n:
                    out.append(SoftmaxLaunch(False, m, block_n, max(1, threads // target.warp_size)))
    if block_n >= LOOPED_MIN_COLS:
        for block in (b for b in TUNE_LOOPED_BLOCKS if b <= block_n):
            out += [SoftmaxLaunch(True, 1, block, max(1, t // target.warp_size)) for t in TUNE_LOOPED_THREADS]
    return list(dict.fromkeys(out))


def launch_choice(
    n_rows: int,
    n_cols: int,
    itemsize: int,
    target: Target,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    looped_block: int | None = None,
) -> SoftmaxLaunch:
    """Kernel and blocks for one input: what ``softmax`` launches and what the ahead-of-time compile covers."""
    config = softmax_config(target)
    block_n = triton.next_power_of_2(n_cols)
    if block_n <= config.max_fused_cols and looped_block is None:
        block_m = rows_per_program or config.rows_per_program(block_n)
        block_m = min(triton.next_power_of_2(block_m), triton.next_power_of_2(n_rows))
        warps = num_warps or config.num_warps(block_m * block_n, target.warp_size)
        return SoftmaxLaunch(looped=False, block_m=block_m, block_n=block_n, num_warps=warps)
    block = looped_block or config.looped_block(itemsize)
    warps = num_warps or config.num_warps(block, target.warp_size)
    return SoftmaxLaunch(looped=True, block_m=1, block_n=block, num_warps=warps)


def softmax(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    looped_block: int | None = None,
) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D GPU tensor (row stride may exceed the width)."""
    if x.ndim != 2 or x.stride(1) != 1:
        raise ValueError(f"softmax: x must be 2-D with unit column stride, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    y = x.new_empty(x.shape) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or y.stride(1) != 1:
        raise ValueError(f"softmax: out must be a {x.dtype} tensor of shape {tuple(x.shape)}")
    if n_rows == 0 or n_cols == 0:
        return y
    launch = launch_choice(n_rows, n_cols, x.element_size(), current_target(), rows_per_program=rows_per_program,
                           num_warps=num_warps, looped_block=looped_block)
    if launch.looped:
        softmax_looped_kernel[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0), BLOCK_N=launch.block_n,
                                         num_warps=launch.num_warps)
    else:
        softmax_kernel[(triton.cdiv(n_rows, launch.block_m),)](
            x, y, n_rows, n_cols, x.stride(0), y.stride(0), BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
            num_warps=launch.num_warps)
    return y
