"""Matrix-vector products of a decode step in Triton, with the step's small operations fused in.

``gemv_kernel`` gives each program BLOCK_N weight rows, walks them BLOCK_K columns at a time with float32 partial
products reduced once, and adds bias and residual before its one store; ``NORM`` RMS-normalises the activations on
the way in, ``GATED`` stores silu(gate) * up of a SwiGLU MLP. The design and its measurements are in docs/llm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .config import Target, interpreted, launch_pdl, quick_bench

if TYPE_CHECKING:
    import torch

# The product sizes a 7B decoder has (N rows by K columns, 3.5k-38k each way): a few tile shapes, timed once per
# shape on the device by triton.autotune when the decode step first runs (before any graph is captured; each config
# timed for 30 ms, as the elementwise kernels' are, not Triton's default 125 ms). A
# loop step's loads are all a thread has in flight (nothing pipelines them), so the tiles go up to 128 elements
# a thread (sixteen 16-byte loads of a 2-byte type): BLOCK_N * BLOCK_K / (32 * num_warps).
CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w)
    for n, k, w in ((1, 1024, 4), (2, 512, 2), (2, 1024, 4), (4, 256, 2), (4, 512, 4), (4, 1024, 8), (8, 256, 4),
                    (8, 512, 4), (16, 256, 8), (16, 512, 8), (8, 512, 2), (16, 256, 2), (16, 512, 4),
                    (32, 256, 4), (8, 1024, 4), (32, 512, 8), (16, 1024, 4), (32, 512, 4), (64, 256, 4))
]


@triton.jit
def _weight_tile(w_ptr, gate_rows, up_rows, cols, row_ok, K, GATED: tl.constexpr):
    """One BLOCK_N x BLOCK_K tile of the gate rows (and of the up rows with GATED), read once: evict first."""
    mask = row_ok[:, None] & (cols < K)[None, :]
    w = tl.load(w_ptr + gate_rows[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    up = w
    if GATED:
        up = tl.load(w_ptr + up_rows[:, None] + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    return w, up


@triton.jit
def _accumulate(acc, acc_up, squares, w, up, x_ptr, norm_ptr, cols, K, GATED: tl.constexpr, NORM: tl.constexpr):
    col_ok = cols < K
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if NORM:
        squares += x * x
        x = x * tl.load(norm_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * x[None, :]
    if GATED:
        acc_up += up.to(tl.float32) * x[None, :]
    return acc, acc_up, squares


@triton.autotune(configs=CONFIGS, key=["N", "K", "GATED"], do_bench=quick_bench)
@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, norm_ptr, y_ptr, N, K,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GATED: tl.constexpr, NORM: tl.constexpr, EPS: tl.constexpr,
    PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    gate_rows = rows.to(tl.int64) * K
    up_rows = (rows + N).to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    squares = tl.zeros((BLOCK_K,), tl.float32)
    cols = tl.arange(0, BLOCK_K)
    # The weights are no earlier kernel's output: with PDL the first tile is read while that kernel drains.
    w, up = _weight_tile(w_ptr, gate_rows, up_rows, cols, row_ok, K, GATED)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    acc, acc_up, squares = _accumulate(acc, acc_up, squares, w, up, x_ptr, norm_ptr, cols, K, GATED, NORM)
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        w, up = _weight_tile(w_ptr, gate_rows, up_rows, cols, row_ok, K, GATED)
        acc, acc_up, squares = _accumulate(acc, acc_up, squares, w, up, x_ptr, norm_ptr, cols, K, GATED, NORM)
    y = tl.sum(acc, axis=1)
    up_sum = tl.sum(acc_up, axis=1)
    if NORM:  # RMS norm of x, a scalar factor of the whole product: every program sums x's squares itself
        scale = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + EPS)
        y *= scale
        up_sum *= scale
    if GATED:
        y = y * tl.sigmoid(y) * up_sum
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        y += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def flags(bias: bool = False, residual: bool = False, gated: bool = False, eps: float | None = None,
          pdl: bool = False) -> dict:
    """The fused form's constexprs (``eps``: the RMS norm's, None for no norm; ``pdl``: launched as a
    programmatic dependent). EPS is a constexpr because torch.compile passes a Python float argument as float64."""
    return {"HAS_BIAS": bias, "HAS_RESIDUAL": residual, "GATED": gated, "NORM": eps is not None,
            "EPS": float(eps or 0.0), "PDL": pdl}


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, gated: bool = False,
         norm: tuple[torch.Tensor, float] | None = None, config: triton.Config | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ residual)`` for one row ``x`` (any leading dims of size 1), or with ``gated``
    ``silu(x @ gate.T) * (x @ up.T)`` for ``weight`` = [gate; up]; with ``norm`` = (weight, eps) x is first
    RMS-normalised (x / sqrt(mean(x²) + eps) * weight). Float32 accumulation, x's dtype out.
    ``config``: one of CONFIGS instead of the autotuned choice (the interpreter cannot time configs)."""
    y, args, meta = _launch(x, weight, bias, residual, gated, norm)
    n = y.shape[-1]
    if config is None:
        gemv_kernel[lambda m: (triton.cdiv(n, m["BLOCK_N"]),)](*args, **meta)
    else:
        gemv_kernel.fn[(triton.cdiv(n, config.kwargs["BLOCK_N"]),)](*args, **meta, **config.kwargs,
                                                                     num_warps=config.num_warps)
    return y


def warm_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              residual: torch.Tensor | None = None, gated: bool = False,
              norm: tuple[torch.Tensor, float] | None = None, target: Target | None = None) -> None:
    """Compile every configuration :func:`gemv` would autotune over for arguments of these shapes and dtypes on
    ``target`` (default: the running device), launching nothing: inside :func:`~.config.parallel_compile` they compile
    at once, where the autotuner's first launch compiles them one by one. Tensors count by shape and dtype only
    (``meta`` ones do), as Triton's ``warmup`` takes pointers for aligned tensors."""
    import torch

    if not interpreted():
        _, args, meta = _launch(x, weight, bias, residual, gated, norm, launch_pdl(target))
        dtypes = [a.dtype if isinstance(a, torch.Tensor) else a for a in args]
        gemv_kernel.warmup(*dtypes, **meta, grid=(1,))


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
            gated: bool, norm: tuple[torch.Tensor, float] | None, pdl: bool | None = None
            ) -> tuple[torch.Tensor, tuple, dict]:
    """(output, the kernel's arguments, its constexprs and launch options) of one product, the inputs checked;
    ``pdl``: as a programmatic dependent (default: where the running device allows it)."""
    import torch

    rows, k = weight.shape
    n = rows // 2 if gated else rows
    if x.numel() != k or x.shape[-1] != k or not weight.is_contiguous() or (gated and rows % 2):
        raise ValueError(f"gemv takes one row of {k} values and a contiguous weight, got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}{' (gated: an even row count)' if gated else ''}")
    for name, extra in (("bias", bias), ("residual", residual)):
        if extra is not None and extra.numel() != n:
            raise ValueError(f"gemv: {name} of {extra.numel()} values for {n} outputs")
    x = x.contiguous()
    y = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    residual = residual.contiguous() if residual is not None else None
    norm_weight, eps = norm if norm is not None else (y, None)
    if norm is not None and norm_weight.numel() != k:
        raise ValueError(f"gemv: norm weight of {norm_weight.numel()} values for {k} inputs")
    args = (x, weight, bias if bias is not None else y, residual if residual is not None else y, norm_weight, y, n, k)
    pdl = launch_pdl() if pdl is None else pdl
    return y, args, {**flags(bias is not None, residual is not None, gated, eps, pdl),
                     **({"launch_pdl": True} if pdl else {})}


@triton.jit
def silu_mul_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """One block of one row: silu(gate) * up in float32, rounded once."""
    row = tl.program_id(axis=0).to(tl.int64)
    cols = tl.program_id(axis=1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    gate = tl.load(x_ptr + row * 2 * n + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + n + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + cols, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=ok)


SILU_MUL_BLOCK, SILU_MUL_WARPS = 2048, 4  # 16 values a thread: two 16-byte loads of each half


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for a contiguous ``x`` = [gate | up] along its last dim (a prefill's gate/up
    product): one pass over it, where a compiled layer's fused activation read it at half the bandwidth."""
    import torch

    if not x.is_contiguous() or x.shape[-1] % 2:
        raise ValueError(f"silu_mul takes a contiguous [gate | up] tensor of even width, got {tuple(x.shape)}")
    n = x.shape[-1] // 2
    y = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    rows = x.numel() // (2 * n)
    if rows:
        silu_mul_kernel[(rows, triton.cdiv(n, SILU_MUL_BLOCK))](x, y, n, BLOCK=SILU_MUL_BLOCK,
                                                                num_warps=SILU_MUL_WARPS)
    return y
