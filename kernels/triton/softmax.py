"""Row softmax of a 2-D tensor in Triton, in the style of the Triton tutorials.

``softmax_kernel`` keeps whole rows (several short ones a program) in registers; wider rows take
``softmax_split_kernel`` on a GPU (SPLIT programs a row, exchanging (max, sum) through global memory): each element
is read once and written once. ``softmax_looped_kernel`` (online pass, then a backward normalising pass: 1.5x the
bytes) runs in the interpreter and stays a tuning candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import triton
import triton.language as tl

from .aot import DTYPES, Launch
from .config import Target, current_target, interpreted, softmax_config

# torch only annotates here: compiling ahead of time (gpulab.toolchains) then does not import it.
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


# Reads a program makes of its row's arrival count before it gives up (2^22 L2 round trips): a bound, so a
# launch that breaks the co-residency assumption writes NaN (which the benchmark's gate fails) instead of
# hanging the GPU.
SPLIT_MAX_SPINS = tl.constexpr(1 << 22)


@triton.jit
def softmax_split_kernel(
    x_ptr, y_ptr, ticket_ptr, count_ptr, max_ptr, sum_ptr, n_cols, x_row_stride, y_row_stride,
    SPLIT: tl.constexpr, BLOCK_N: tl.constexpr
):
    # Tickets are handed out in the order programs start (CUB's decoupled look-back does the same), so a
    # program only ever waits for chunks of its own row whose programs are running or not yet started; with
    # SPLIT no more than the programs the GPU holds at once, a slot is always free for them.
    ticket = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    row = ticket // SPLIT
    cols = (ticket % SPLIT) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    row64 = row.to(tl.int64)
    x = tl.load(x_ptr + row64 * x_row_stride + cols, mask=mask, other=-float("inf"),
                eviction_policy="evict_first").to(tl.float32)
    chunk_max = tl.max(x, axis=0)
    # A chunk past a ragged row's end is all -inf: exp against 0 instead of -inf keeps its sum 0, not NaN.
    ref = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    numerator = tl.exp(x - ref)
    # Partial i of row r sits at r * SPLIT + i: the ticket itself.
    tl.store(max_ptr + ticket, chunk_max)
    tl.store(sum_ptr + ticket, tl.sum(numerator, axis=0))
    # Every thread's part of the block reductions is done before one thread publishes the partials.
    tl.debug_barrier()
    # acq_rel: the last program to arrive does not spin, and must still see the others' partials.
    arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel") + 1
    spins = 0
    while (arrived < SPLIT) & (spins < SPLIT_MAX_SPINS):
        arrived = tl.atomic_add(count_ptr + row, 0, sem="acquire")
        spins += 1
    parts = row64 * SPLIT + tl.arange(0, SPLIT)
    maxes = tl.load(max_ptr + parts, volatile=True)  # volatile: from L2, not a stale L1 line
    sums = tl.load(sum_ptr + parts, volatile=True)
    row_max = tl.max(maxes, axis=0)
    total = tl.sum(tl.where(maxes == -float("inf"), 0.0, sums * tl.exp(maxes - row_max)), axis=0)
    total = tl.where(arrived >= SPLIT, total, float("nan"))  # gave up waiting: NaN, never a wrong number
    y = numerator * (tl.exp(ref - row_max) / total)
    # A streaming store (.cs, evict first): the output is not read again, and in L2 it would only push out the
    # rows still being loaded and the workspace the waiting programs read.
    tl.store(y_ptr + row64 * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask, cache_modifier=".cs")


@dataclass(frozen=True)
class SoftmaxLaunch:
    kernel: str  # fused (softmax_kernel) | split (softmax_split_kernel) | looped (softmax_looped_kernel)
    block_m: int  # rows per program (1 for the split and looped kernels)
    block_n: int  # columns per program (fused, split) or per step (looped)
    num_warps: int
    split: int = 1  # programs per row (split kernel)

    @property
    def label(self) -> str:
        if self.kernel == "looped":
            return f"looped BLOCK_N={self.block_n} num_warps={self.num_warps}"
        if self.kernel == "split":
            return f"split SPLIT={self.split} BLOCK_N={self.block_n} num_warps={self.num_warps}"
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} num_warps={self.num_warps}"

    def overrides(self) -> dict[str, int | None]:
        """The keyword arguments of :func:`softmax` that make exactly this launch."""
        return {"rows_per_program": self.block_m if self.kernel == "fused" else None, "num_warps": self.num_warps,
                "looped_block": self.block_n if self.kernel == "looped" else None,
                "split": self.split if self.kernel == "split" else None}


# The tuning sweep's space (gpulab.bench.tune): rows per program from a quarter to four times launch_choice's,
# threads per program as the sweeps that set SOFTMAX measured them, and the looped kernel's blocks for rows at
# least LOOPED_MIN_COLS wide (at 4096x16384 the fused and looped kernels were within a few percent). Rows wider
# than a program's budget also try one to four times launch_choice's SPLIT at 4 to 64 elements per thread.
TUNE_ROWS_FACTORS = (0.25, 0.5, 1, 2, 4)
TUNE_THREADS = (128, 256, 512, 1024)
TUNE_LOOPED_BLOCKS = (2048, 4096, 8192)
TUNE_LOOPED_THREADS = (256, 512, 1024)
TUNE_SPLIT_FACTORS = (0.5, 1, 2, 4)
TUNE_SPLIT_ELEMS_PER_THREAD = (4, 64)
LOOPED_MIN_COLS = 4096


def launch_candidates(n_rows: int, n_cols: int, itemsize: int, target: Target) -> list[SoftmaxLaunch]:
    """Every launch the tuning sweep times for one input, launch_choice's among them. A fused program holds at
    most ``max_fused_cols`` elements (the register budget the family's table gives one wide row) and at least
    one per thread."""
    config, pick = softmax_config(target), launch_choice(n_rows, n_cols, itemsize, target)
    block_n = triton.next_power_of_2(n_cols)
    out = [pick]
    if block_n <= config.max_fused_cols:
        base = pick.block_m if pick.kernel == "fused" else 1
        for m in sorted({max(1, int(base * f)) for f in TUNE_ROWS_FACTORS}):
            m = min(triton.next_power_of_2(m), triton.next_power_of_2(n_rows))
            for threads in TUNE_THREADS:
                if m * block_n <= config.max_fused_cols and threads <= m * block_n:
                    out.append(SoftmaxLaunch("fused", m, block_n, max(1, threads // target.warp_size)))
    if pick.kernel == "split":
        out += _split_candidates(n_cols, pick.split, itemsize, target)
    if block_n >= LOOPED_MIN_COLS:
        for block in (b for b in TUNE_LOOPED_BLOCKS if b <= block_n):
            out += [SoftmaxLaunch("looped", 1, block, max(1, t // target.warp_size)) for t in TUNE_LOOPED_THREADS]
    return list(dict.fromkeys(out))


def _split_candidates(n_cols: int, split: int, itemsize: int, target: Target) -> list[SoftmaxLaunch]:
    out = []
    low, high = TUNE_SPLIT_ELEMS_PER_THREAD
    for s in (int(split * f) for f in TUNE_SPLIT_FACTORS):
        if split_problem(n_cols, s, target, itemsize):
            continue
        block = triton.next_power_of_2(triton.cdiv(n_cols, s))
        out += [SoftmaxLaunch("split", 1, block, t // target.warp_size, s) for t in TUNE_THREADS
                if low <= block // t <= high]
    return out


def split_problem(n_cols: int, split: int, target: Target, itemsize: int = 4) -> str:
    """Why ``softmax_split_kernel`` cannot take rows of ``n_cols`` in ``split`` programs each; empty if it can.
    Its programs wait for each other, so all of a row's must be able to run at once: at most one per SM or CU
    (a chunk is sized to one program's register budget, which fits an SM), and not in the interpreter. The
    budget is in bytes of the input: a 2-byte dtype's chunk may hold twice the elements."""
    limit = softmax_config(target).max_fused_cols * max(1, 4 // itemsize)
    block = triton.next_power_of_2(triton.cdiv(n_cols, split))
    if split < 2 or split & (split - 1):
        return f"SPLIT={split} is not a power of two >= 2"
    if block > limit:
        return f"a chunk of {block} columns is wider than one program's {limit}"
    if target.backend == "interpreter":
        return "the interpreter runs programs one at a time, and the split kernel's programs wait for each other"
    if target.units and split > target.units:
        return f"SPLIT={split} programs per row exceed the {target.units} SMs/CUs that surely run them at once"
    return ""


def launch_choice(
    n_rows: int,
    n_cols: int,
    itemsize: int,
    target: Target,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    looped_block: int | None = None,
    split: int | None = None,
) -> SoftmaxLaunch:
    """Kernel and blocks for one input: what ``softmax`` launches and what the ahead-of-time compile covers.
    Rows that fit one program are fused; wider ones are split into chunks of about the family's
    ``split_elems`` (a power of two of programs per row), or looped where splitting is not possible (see
    :func:`split_problem`). An explicit ``split`` or ``looped_block`` picks that kernel; an impossible
    ``split`` raises ValueError."""
    config = softmax_config(target)
    block_n = triton.next_power_of_2(n_cols)
    fused = block_n <= config.max_fused_cols
    if split is None and looped_block is None and not fused:
        candidate = triton.next_power_of_2(triton.cdiv(n_cols, config.split_elems))
        split = None if split_problem(n_cols, candidate, target) else candidate
    if split is not None:
        problem = split_problem(n_cols, split, target, itemsize)
        if problem:
            raise ValueError(f"softmax: cannot split rows of {n_cols} columns: {problem}")
        block = triton.next_power_of_2(triton.cdiv(n_cols, split))
        warps = num_warps or config.num_warps(block, target.warp_size, config.split_elems_per_thread)
        return SoftmaxLaunch("split", block_m=1, block_n=block, num_warps=warps, split=split)
    if fused and looped_block is None:
        block_m = rows_per_program or config.rows_per_program(block_n)
        block_m = min(triton.next_power_of_2(block_m), triton.next_power_of_2(n_rows))
        warps = num_warps or config.num_warps(block_m * block_n, target.warp_size)
        return SoftmaxLaunch("fused", block_m=block_m, block_n=block_n, num_warps=warps)
    block = looped_block or config.looped_block(itemsize)
    warps = num_warps or config.num_warps(block, target.warp_size)
    return SoftmaxLaunch("looped", block_m=1, block_n=block, num_warps=warps)


def split_workspace(n_rows: int, split: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The split kernel's ticket, per-row arrival counts and per-chunk max and sum: one zeroed allocation per
    call, made inside the timed call since it is part of the op's cost. Sections start 16 bytes apart."""
    import torch

    head = 4 + triton.cdiv(n_rows, 4) * 4
    ws = torch.zeros(head + 2 * n_rows * split, dtype=torch.int32, device=device)
    partials = ws[head:].view(torch.float32)
    return ws[:1], ws[4:4 + n_rows], partials[:n_rows * split], partials[n_rows * split:]


def softmax(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    looped_block: int | None = None,
    split: int | None = None,
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
                           num_warps=num_warps, looped_block=looped_block, split=split)
    workspace = split_workspace(n_rows, launch.split, x.device) if launch.kernel == "split" else ()
    kernel, grid, args, meta = _kernel_call(launch, (x, y), workspace, n_rows, n_cols, (x.stride(0), y.stride(0)))
    kernel[grid](*args, **meta)
    return y


def _kernel_call(launch: SoftmaxLaunch, pointers: tuple, workspace: tuple, n_rows: int, n_cols: int,
                 strides: tuple[int, int]) -> tuple[Any, tuple[int], tuple, dict[str, int]]:
    """(kernel, grid, arguments, constexprs and launch options) of one launch of ``launch``."""
    if launch.kernel == "split":
        return (softmax_split_kernel, (n_rows * launch.split,), (*pointers, *workspace, n_cols, *strides),
                {"SPLIT": launch.split, "BLOCK_N": launch.block_n, "num_warps": launch.num_warps})
    if launch.kernel == "looped":
        return (softmax_looped_kernel, (n_rows,), (*pointers, n_cols, *strides),
                {"BLOCK_N": launch.block_n, "num_warps": launch.num_warps})
    return (softmax_kernel, (triton.cdiv(n_rows, launch.block_m),), (*pointers, n_rows, n_cols, *strides),
            {"BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n, "num_warps": launch.num_warps})


def warm_softmax(shape: tuple[int, ...], dtype: torch.dtype, target: Target) -> None:
    """Compile the kernel :func:`softmax` launches for a contiguous input of this shape and torch dtype on
    ``target``, launching nothing (pointers given as their dtype, as Triton's ``warmup`` takes them)."""
    import torch

    n_rows, n_cols = shape
    if n_rows == 0 or n_cols == 0 or interpreted():
        return
    launch = launch_choice(n_rows, n_cols, dtype.itemsize, target)
    workspace = (torch.int32, torch.int32, torch.float32, torch.float32) if launch.kernel == "split" else ()
    kernel, _, args, meta = _kernel_call(launch, (dtype, dtype), workspace, n_rows, n_cols, (n_cols, n_cols))
    kernel.warmup(*args, **meta, grid=(1,))


# Row widths the ahead-of-time compile covers (gpulab.toolchains): every power of two the fused kernel takes (16 ..
# max_fused_cols), then the widest row of the benchmark's sizes for the split kernel (its chunk, hence its code, is
# the same for every SPLIT but the partials' load), and the looped kernel's default block. Narrower rows are padded to
# 16 columns' worth of layout anyway.
AOT_MIN_COLS = 16
AOT_SPLIT_COLS = 131072
AOT_ROWS = 1 << 16  # enough rows that rows_per_program is never capped by the tensor's height


def aot_launches(dtype: str, target: Target) -> list[Launch]:
    """Every launch ``softmax`` makes on ``target``'s family for ``dtype``, one per kernel and launch variant."""
    _, itemsize = DTYPES[dtype]
    config = softmax_config(target)
    widths = [AOT_MIN_COLS << k for k in range((config.max_fused_cols // AOT_MIN_COLS).bit_length())]
    choices = [launch_choice(AOT_ROWS, width, itemsize, target) for width in [*widths, AOT_SPLIT_COLS]]
    choices.append(launch_choice(AOT_ROWS, AOT_SPLIT_COLS, itemsize, target,
                                 looped_block=config.looped_block(itemsize)))
    launches = [_aot_launch(choice, dtype) for choice in choices]
    return list({(launch.kernel, launch.variant): launch for launch in launches}.values())


def _aot_launch(choice: SoftmaxLaunch, dtype: str) -> Launch:
    ty = DTYPES[dtype][0]
    pointers = {"x_ptr": f"*{ty}", "y_ptr": f"*{ty}"}
    strides = ("n_cols", "x_row_stride", "y_row_stride")
    if choice.kernel == "split":
        kernel, ints = softmax_split_kernel, strides
        pointers |= {"ticket_ptr": "*i32", "count_ptr": "*i32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
        constexprs = {"SPLIT": choice.split, "BLOCK_N": choice.block_n}
    elif choice.kernel == "looped":
        kernel, ints, constexprs = softmax_looped_kernel, strides, {"BLOCK_N": choice.block_n}
    else:
        kernel, ints = softmax_kernel, ("n_rows", *strides)
        constexprs = {"BLOCK_M": choice.block_m, "BLOCK_N": choice.block_n}
    signature = pointers | dict.fromkeys(ints, "i32") | dict.fromkeys(constexprs, "constexpr")
    variant = " ".join(f"{k}={v}" for k, v in constexprs.items()) + f" num_warps={choice.num_warps}"
    return Launch(op="softmax", kernel=kernel, variant=variant, dtype=dtype, signature=signature,
                  constexprs=constexprs, num_warps=choice.num_warps)
