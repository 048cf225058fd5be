"""Decode attention in Triton (flash-decoding): the one new query token of every head over a static KV cache.

``decode_attention_kernel`` splits the cache along its positions (one KV head and one chunk a program, its query
heads as rows, nothing read past ``pos``), keeps an online softmax in float32, applies RoPE and writes the new
position's k and v itself; ``decode_attention_combine_kernel`` adds the chunks. ``prefill_rope_kernel`` does a
prompt's RoPE and cache write. The design and its measurements are in docs/llm.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .config import launch_pdl

if TYPE_CHECKING:
    import torch

BLOCK_N = 32  # cache positions per product: tl.dot needs 16 or more
MAX_SPLITS = 64  # chunks per KV head: the combine kernel holds one partial row of each
PREFILL_ROPE_TOKENS = 16  # a prompt's tokens per RoPE program: a (16, head_dim) tile


@triton.jit
def _after_previous(PDL: tl.constexpr):
    """Launched as a programmatic dependent (PDL): let the next kernel launch, then wait until the previous
    kernel's writes are visible. Everything these kernels read comes from earlier kernels of the step."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _rope(x_ptr, cos_ptr, sin_ptr, half, mask, HALF: tl.constexpr, DTYPE: tl.constexpr):
    """Rotate-half RoPE of a vector (or of rows of them) at ``x_ptr``, as its two halves: in float32, rounded
    once to ``DTYPE``."""
    lo = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    hi = tl.load(x_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    out_lo = lo * tl.load(cos_ptr + half).to(tl.float32) - hi * tl.load(sin_ptr + half).to(tl.float32)
    out_hi = hi * tl.load(cos_ptr + HALF + half).to(tl.float32) + lo * tl.load(sin_ptr + HALF + half).to(tl.float32)
    return out_lo.to(DTYPE), out_hi.to(DTYPE)


@triton.jit
def prefill_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, pos_ptr, max_len, tokens,
                        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
                        PDL: tl.constexpr):
    """A prompt's RoPE and cache write, BLOCK_T tokens a program: one program per q head and per KV head (axis 0)
    and block of tokens (axis 1) rotates a (BLOCK_T, head_dim) tile of q into ``q_ptr`` laid out (tokens, heads,
    head_dim), or of k into the cache at the tokens' positions, with their v (one token a program moved 256
    bytes)."""
    _after_previous(PDL)
    head = tl.program_id(axis=0)
    token = tl.program_id(axis=1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = (token < tokens)[:, None]
    read = tl.minimum(token, tokens - 1)[:, None]  # a last block's rows past the prompt read its last token
    half = tl.arange(0, HEAD_DIM // 2)[None, :]
    x = qkv_ptr + read * (HEADS + 2 * KV_HEADS) * HEAD_DIM
    lo, hi = _rope(x + head * HEAD_DIM + half, cos_ptr + read * HEAD_DIM, sin_ptr + read * HEAD_DIM, half, rows,
                   HEAD_DIM // 2, k_ptr.dtype.element_ty)
    if head < HEADS:
        row = (token[:, None] * HEADS + head) * HEAD_DIM
        tl.store(q_ptr + row + half, lo, mask=rows)
        tl.store(q_ptr + row + HEAD_DIM // 2 + half, hi, mask=rows)
    else:
        kv = head - HEADS
        row = (kv.to(tl.int64) * max_len + tl.load(pos_ptr + read)) * HEAD_DIM
        tl.store(k_ptr + row + half, lo, mask=rows)
        tl.store(k_ptr + row + HEAD_DIM // 2 + half, hi, mask=rows)
        dims = tl.arange(0, HEAD_DIM)[None, :]
        tl.store(v_ptr + row + dims, tl.load(x + (HEADS + KV_HEADS + kv) * HEAD_DIM + dims), mask=rows)


@triton.jit
def _rope_rows(x_ptr, cos_ptr, sin_ptr, dims, mask, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """Rotate-half RoPE of whole rows at ``x_ptr`` (``dims`` along the last axis): x·cos + rotate_half(x)·sin with
    rotate_half read as a second, shifted load, so the result keeps the layout of one plain load."""
    HALF: tl.constexpr = HEAD_DIM // 2
    x = tl.load(x_ptr + dims, mask=mask, other=0.0).to(tl.float32)
    swapped = tl.load(x_ptr + (dims + HALF) % HEAD_DIM, mask=mask, other=0.0).to(tl.float32)
    sin = tl.where(dims < HALF, -1.0, 1.0) * tl.load(sin_ptr + dims).to(tl.float32)
    return (x * tl.load(cos_ptr + dims).to(tl.float32) + swapped * sin).to(DTYPE)


@triton.jit
def decode_attention_kernel(
    qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, max_ptr, sum_ptr, max_len,
    SCALE_LOG2: tl.constexpr, HEADS: tl.constexpr, GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    _after_previous(PDL)
    kv = tl.program_id(axis=0)
    split = tl.program_id(axis=1)
    pos = tl.load(pos_ptr)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, pos + 1)
    if start < end:  # chunks past the current position are skipped; the combine kernel skips them too
        rows = tl.arange(0, GROUPS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < GROUPS
        dtype = k_ptr.dtype.element_ty
        # q rotated by every program of its KV head (a few hundred values)
        q = _rope_rows(qkv_ptr + (kv * GROUPS + rows)[:, None] * HEAD_DIM, cos_ptr, sin_ptr, dims[None, :],
                       row_ok[:, None], HEAD_DIM, dtype)
        # the new token's k rotated, and its v: the chunk holding its position stores them into the caches, and
        # its products take them from registers (no program reads a cache row written in this step)
        k_new = _rope_rows(qkv_ptr + (HEADS + kv) * HEAD_DIM, cos_ptr, sin_ptr, dims, dims >= 0, HEAD_DIM, dtype)
        v_new = tl.load(qkv_ptr + (HEADS + HEADS // GROUPS + kv) * HEAD_DIM + dims)
        head = kv.to(tl.int64) * max_len * HEAD_DIM
        if end == pos + 1:
            tl.store(k_ptr + head + pos * HEAD_DIM + dims, k_new)
            tl.store(v_ptr + head + pos * HEAD_DIM + dims, v_new)
        row_max = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
        row_sum = tl.zeros([GROUPS_PAD], tl.float32)
        acc = tl.zeros([GROUPS_PAD, HEAD_DIM], tl.float32)
        # constant bounds (a chunk is one block up to 2048 cache positions); blocks past ``end`` load nothing
        for first in range(0, CHUNK, BLOCK_N):
            cols = start + first + tl.arange(0, BLOCK_N)
            cached = (cols < tl.minimum(end, pos))[:, None]
            new = (cols == pos)[:, None]
            offsets = head + cols[:, None] * HEAD_DIM + dims[None, :]
            k = tl.where(new, k_new[None, :], tl.load(k_ptr + offsets, mask=cached, other=0.0))
            # ieee: exact float32 products for float32 caches (tf32 exists on neither gfx90a nor RDNA)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * SCALE_LOG2
            scores = tl.where((cols < end)[None, :], scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))
            rescale = tl.exp2(row_max - new_max)
            p = tl.exp2(scores - new_max[:, None])
            row_sum = row_sum * rescale + tl.sum(p, axis=1)
            v = tl.where(new, v_new[None, :], tl.load(v_ptr + offsets, mask=cached, other=0.0))
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            row_max = new_max
        out = (kv * SPLITS + split) * GROUPS + rows
        tl.store(part_ptr + out[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(max_ptr + out, row_max, mask=row_ok)
        tl.store(sum_ptr + out, row_sum, mask=row_ok)


@triton.jit
def decode_attention_combine_kernel(
    part_ptr, max_ptr, sum_ptr, pos_ptr, o_ptr,
    GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr, PDL: tl.constexpr,
):
    _after_previous(PDL)
    head = tl.program_id(axis=0)
    kv = head // GROUPS
    group = head % GROUPS
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    active = splits < (tl.load(pos_ptr) // CHUNK + 1)
    rows = (kv * SPLITS + splits) * GROUPS + group
    chunk_max = tl.load(max_ptr + rows, mask=active, other=float("-inf"))
    weight = tl.where(active, tl.exp2(chunk_max - tl.max(chunk_max, axis=0)), 0.0)
    total = tl.sum(weight * tl.load(sum_ptr + rows, mask=active, other=0.0), axis=0)
    part = tl.load(part_ptr + rows[:, None] * HEAD_DIM + dims[None, :], mask=active[:, None], other=0.0)
    out = tl.sum(weight[:, None] * part, axis=0) / total
    tl.store(o_ptr + head * HEAD_DIM + dims, out.to(o_ptr.dtype.element_ty))


def takes_head_dim(head_dim: int) -> bool:
    """Head sizes the kernels take: a power of two, 16 or more (tl.arange and tl.dot)."""
    return head_dim >= 16 and not head_dim & (head_dim - 1)


def decode_split(max_len: int) -> tuple[int, int]:
    """(positions per chunk, chunks): chunks of whole BLOCK_N blocks, at most MAX_SPLITS of them."""
    splits = min(MAX_SPLITS, triton.cdiv(max_len, BLOCK_N))
    chunk = triton.cdiv(triton.cdiv(max_len, splits), BLOCK_N) * BLOCK_N
    return chunk, triton.cdiv(max_len, chunk)


def launch_constexprs(heads: int, kv_heads: int, head_dim: int, max_len: int, pdl: bool = False
                      ) -> tuple[dict, dict, dict]:
    """The constexprs of the RoPE, split and combine kernels for these shapes (the launcher's and the
    ahead-of-time compile's: gpulab.kernels.triton.launches); ``pdl``: launched as programmatic dependents. The
    scale is a constexpr because torch.compile passes a Python float argument as float64, which the loop would
    carry."""
    groups = heads // kv_heads
    chunk, splits = decode_split(max_len)
    shared = {"GROUPS": groups, "HEAD_DIM": head_dim, "CHUNK": chunk, "SPLITS": splits, "PDL": pdl}
    attend = {**shared, "SCALE_LOG2": math.log2(math.e) / math.sqrt(head_dim), "HEADS": heads,
              "GROUPS_PAD": max(16, triton.next_power_of_2(groups)), "BLOCK_N": BLOCK_N}
    rope = {"HEADS": heads, "KV_HEADS": kv_heads, "HEAD_DIM": head_dim, "PDL": pdl}
    return rope, attend, {**shared, "SPLITS_PAD": triton.next_power_of_2(splits)}


def _check_rows(name: str, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                cache_v: torch.Tensor, pos: torch.Tensor, heads: int, tokens: int) -> None:
    """The kernels' shared contract: ``tokens`` contiguous q/k/v rows, a cos/sin row and a position each, over
    contiguous caches of a head size the kernels take."""
    _, kv_heads, _, head_dim = cache_k.shape
    width = (heads + 2 * kv_heads) * head_dim
    if qkv.shape != (1, tokens, width) or heads % kv_heads or cos.shape != (tokens, head_dim) or \
            sin.shape != cos.shape or pos.numel() != tokens or not all(
            t.is_contiguous() for t in (qkv, cos, sin, cache_k, cache_v, pos)):
        raise ValueError(f"{name} takes contiguous q/k/v rows of {width} values, one cos/sin row and one position a "
                         f"token, over contiguous caches, got qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)}, pos "
                         f"{tuple(pos.shape)}, cache {tuple(cache_k.shape)}")
    if not takes_head_dim(head_dim):
        raise ValueError(f"{name} needs a power-of-two head size of 16 or more, got {head_dim}")


def rope_into_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                    cache_v: torch.Tensor, pos: torch.Tensor, heads: int) -> torch.Tensor:
    """RoPE and the cache write of T tokens: ``qkv`` (1, T, (heads + 2 kv_heads) d) holds their q, k and v before
    RoPE, ``cos``/``sin`` (T, d) their positions' rotary rows, ``pos`` (T,) their positions (a device tensor).
    The caches (1, kv_heads, max_len, d) get the rotated k and the v at those positions; returns the rotated q as
    (1, T, heads, d) in qkv's dtype: attention takes it as (1, heads, T, d) through a transposed view, and
    cuDNN's and flash attention's output then has the token-major layout the output product reads, with no copy."""
    import torch

    tokens = qkv.shape[1] if qkv.dim() == 3 else 0
    _check_rows("rope_into_cache", qkv, cos, sin, cache_k, cache_v, pos, heads, tokens)
    _, kv_heads, max_len, head_dim = cache_k.shape
    pdl = launch_pdl()
    rope, _, _ = launch_constexprs(heads, kv_heads, head_dim, max_len, pdl)
    q = torch.empty(1, tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    launch = {"launch_pdl": True} if pdl else {}
    prefill_rope_kernel[(heads + kv_heads, triton.cdiv(tokens, PREFILL_ROPE_TOKENS))](
        qkv, cos, sin, q, cache_k, cache_v, pos, max_len, tokens, **rope, BLOCK_T=PREFILL_ROPE_TOKENS, num_warps=4,
        **launch)
    return q


def decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                     cache_v: torch.Tensor, pos: torch.Tensor, heads: int) -> torch.Tensor:
    """One new token's attention, RoPE and cache write included: ``qkv`` (1, 1, (heads + 2 kv_heads) d) holds
    its q, k and v before RoPE; ``cos``/``sin`` (1, d) are its position's rotary rows; the caches (1, kv_heads,
    max_len, d) are contiguous and get the rotated k and v at ``pos`` (a (1,) device tensor). Returns
    softmax(q K^T / sqrt(d)) V over positions 0..pos as (1, 1, heads d) in qkv's dtype."""
    import torch

    if qkv.dim() != 3 or qkv.shape[1] != 1 or not qkv.is_contiguous():
        raise ValueError(f"decode_attention takes one token's contiguous q/k/v row, got qkv {tuple(qkv.shape)}")
    _check_rows("decode_attention", qkv, cos, sin, cache_k, cache_v, pos, heads, 1)
    _, kv_heads, max_len, head_dim = cache_k.shape
    pdl = launch_pdl()
    _, attend, combine = launch_constexprs(heads, kv_heads, head_dim, max_len, pdl)
    launch = {"launch_pdl": True} if pdl else {}
    rows = kv_heads * attend["SPLITS"] * attend["GROUPS"]
    part = torch.empty(rows, head_dim, dtype=torch.float32, device=qkv.device)
    maxes = torch.empty(rows, dtype=torch.float32, device=qkv.device)
    sums = torch.empty_like(maxes)
    out = torch.empty(1, 1, heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    decode_attention_kernel[(kv_heads, attend["SPLITS"])](qkv, cos, sin, cache_k, cache_v, pos, part, maxes, sums,
                                                         max_len, **attend, num_warps=4, **launch)
    decode_attention_combine_kernel[(heads,)](part, maxes, sums, pos, out, **combine, num_warps=4, **launch)
    return out
