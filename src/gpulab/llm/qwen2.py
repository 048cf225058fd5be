"""Qwen2 decoder in gpt-fast's shape: the weights, a static :class:`KVCache`, and one :func:`layer` for the
prefill and the decode step (on a GPU its attention and matrix-vector products are Triton kernels).

The weights are transformers' own tensors; :func:`fuse_projections` stores each layer's Q/K/V and gate/up weights in
one contiguous matrix with transformers' parameters as views of it, so one product reads what three (or two) did.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from gpulab.kernels.triton.config import Target

Attend = Callable[..., torch.Tensor]


class LayerWeights(NamedTuple):
    in_norm: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    w13: torch.Tensor  # gate rows first, then up
    wd: torch.Tensor


@dataclass(frozen=True)
class Dims:
    n_layers: int
    n_heads: int
    n_kv: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    eps: float

    @classmethod
    def of(cls, config: Any) -> Dims:
        if config.model_type != "qwen2" or config.hidden_act != "silu":
            raise ValueError(f"the fast engines implement Qwen2 (silu) decoders, not "
                             f"{config.model_type}/{config.hidden_act}")
        if any(t != "full_attention" for t in getattr(config, "layer_types", ["full_attention"])):
            raise ValueError("the fast engines implement full attention only (Qwen2.5 disables sliding windows)")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(int(config.num_hidden_layers), int(config.num_attention_heads), int(config.num_key_value_heads),
                   int(head_dim), int(config.hidden_size), int(config.intermediate_size), int(config.vocab_size),
                   float(config.rms_norm_eps))

    @property
    def qkv_split(self) -> list[int]:
        return [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim]


def _fuse(modules: list[Any], name: str) -> torch.Tensor:
    """One matrix holding ``modules``' ``name`` tensors in order; the modules' parameters become its views."""
    parts = [getattr(m, name) for m in modules]
    fused = torch.cat([p.data for p in parts])
    for part, view in zip(parts, fused.split([p.shape[0] for p in parts]), strict=True):
        part.data = view
    return fused


def fuse_projections(model: Any) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(wqkv, bqkv, w13) per layer, fused once per model (later calls return the same tensors)."""
    fused = getattr(model, "_gpulab_fused", None)
    if fused is None:
        fused = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            fused.append((_fuse(qkv, "weight"), _fuse(qkv, "bias"), _fuse([mlp.gate_proj, mlp.up_proj], "weight")))
        model._gpulab_fused = fused
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the unfused originals' blocks, so reserved memory stays the weights'
    return fused


@dataclass
class Weights:
    dims: Dims
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor  # (max_len, head_dim), from the model's own rotary module
    sin: torch.Tensor

    @classmethod
    def of(cls, model: Any, max_len: int) -> Weights:
        dims = Dims.of(model.config)
        layers = [LayerWeights(layer.input_layernorm.weight, wqkv, bqkv, layer.self_attn.o_proj.weight,
                               layer.post_attention_layernorm.weight, w13, layer.mlp.down_proj.weight)
                  for layer, (wqkv, bqkv, w13) in zip(model.model.layers, fuse_projections(model), strict=True)]
        lm_head = model.lm_head.weight
        with torch.no_grad():
            positions = torch.arange(max_len, device=lm_head.device)[None]
            cos, sin = model.model.rotary_emb(torch.empty(1, dtype=lm_head.dtype, device=lm_head.device), positions)
        return cls(dims, model.model.embed_tokens.weight, layers, model.model.norm.weight, lm_head,
                   cos[0].contiguous(), sin[0].contiguous())


class KVCache:
    """Static K and V buffers, ``(1, kv_heads, max_len, head_dim)`` per layer, allocated once."""

    def __init__(self, dims: Dims, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (1, dims.n_kv, max_len, dims.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.n_layers)]
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm formula (float32 inside, rounded back before the weight)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; ``x`` is (1, heads, T, head_dim), cos/sin (T, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rotated_heads(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: Dims
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (RoPE applied) and v as (1, heads, T, head_dim) from the fused product ``qkv`` (1, T, width)."""
    tokens = qkv.shape[1]
    q, k, v = qkv.split(dims.qkv_split, dim=-1)
    q = rope(q.view(1, tokens, dims.n_heads, dims.head_dim).transpose(1, 2), cos, sin)
    k = rope(k.view(1, tokens, dims.n_kv, dims.head_dim).transpose(1, 2), cos, sin)
    return q, k, v.view(1, tokens, dims.n_kv, dims.head_dim).transpose(1, 2)


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """(1, heads, T, head_dim) -> (1, T, heads * head_dim): a view where ``out`` is token-major in memory (attention
    gives its output the layout of its query), else a copy."""
    return out.transpose(1, 2).reshape(1, out.shape[2], -1)


def prefill_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor, pos: torch.Tensor, dims: Dims) -> torch.Tensor:
    """A prompt that starts at position 0: its K/V copied into the cache (a plain copy, not a scatter:
    index_put was a third of it on CPU), then causal flash attention over its own K/V. On a GPU the decode
    step's RoPE kernel rotates q and k and writes the cache in one pass (the compiled layer's RoPE and layout
    copies read the product at a tenth of the bandwidth), and attention reads K/V from the cache."""
    if split_kv_available(qkv.device, dims.head_dim):
        tokens = qkv.shape[1]
        q = torch.ops.gpulab_llm.rope_into_cache(qkv, cos, sin, cache_k, cache_v, pos, dims.n_heads).transpose(1, 2)
        return merge_heads(F.scaled_dot_product_attention(q, cache_k[:, :, :tokens], cache_v[:, :, :tokens],
                                                          is_causal=True, enable_gqa=True))
    q, k, v = rotated_heads(qkv, cos, sin, dims)
    cache_k[:, :, : k.shape[2]] = k
    cache_v[:, :, : v.shape[2]] = v
    return merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def triton_decode(device: torch.device) -> bool:
    """Whether a decode step runs the Triton kernels of :mod:`gpulab.kernels.triton` (split-KV attention,
    fused matrix-vector products): on a GPU of either vendor, with Triton installed."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def split_kv_available(device: torch.device, head_dim: int) -> bool:
    """Whether the decode step's attention is Triton's split-KV kernel (and the kernel takes this head size)."""
    if not triton_decode(device):
        return False
    from gpulab.kernels.triton.decode_attention import takes_head_dim

    return takes_head_dim(head_dim)


Norm = tuple[torch.Tensor, float]  # an RMS norm's weight and epsilon


def _one_token_on_gpu(x: torch.Tensor) -> bool:
    """A decode step's activations on a GPU with Triton: the fused Triton products take them."""
    return x.shape[1] == 1 and triton_decode(x.device)


def define_op(name: str, schema: str, impl: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]) -> None:
    """``torch.ops.gpulab_llm.<name>``: ``impl`` as one operator that torch.compile calls without looking
    inside (``fake`` gives its output's shape; ``schema`` marks what it writes, e.g. ``Tensor(a!)``)."""
    if hasattr(torch.ops.gpulab_llm, name):  # already registered in this process
        return
    written = re.findall(r"Tensor\(\w!\) (\w+)", schema)
    op = torch.library.custom_op(f"gpulab_llm::{name}", impl, mutates_args=written, schema=schema)
    op.register_fake(fake)


# The decode step's Triton kernels are operators of their own, so torch.compile treats each call as one opaque
# kernel. Traced as user-defined Triton kernels, every one of a 28-layer step's ~200 calls was compiled to
# Triton IR, several times over, to find what it writes: most of a cold compile of the 7B model's step.
def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
          norm_weight: torch.Tensor | None, eps: float, gated: bool) -> torch.Tensor:
    from gpulab.kernels.triton.gemv import gemv

    return gemv(x, weight, bias, residual, gated=gated, norm=(norm_weight, eps) if norm_weight is not None else None)


define_op("gemv", "(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, Tensor? norm_weight, float eps, "
          "bool gated) -> Tensor", _gemv,
          lambda x, weight, bias, residual, norm_weight, eps, gated:
          x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if gated else weight.shape[0])))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, norm: Norm | None = None) -> torch.Tensor:
    """``residual + rms_norm(x) @ weight.T + bias``: one token on a GPU is one Triton kernel."""
    if _one_token_on_gpu(x):
        return torch.ops.gpulab_llm.gemv(x, weight, bias, residual, *(norm or (None, 0.0)), False)
    y = F.linear(rms_norm(x, *norm) if norm is not None else x, weight, bias)
    return y if residual is None else residual + y


def compile_decode_products(dims: Dims, dtype: torch.dtype, target: Target) -> None:
    """Compile every configuration the decode step's fused products autotune over (:func:`linear`, :func:`swiglu`,
    the output head) for ``target``, all at once on the host's cores, before the step's first run times them.
    Compiled one after another at that run, they were most of a cold start of the 7B model's step. Shapes come
    from meta tensors, so nothing is allocated or launched: a job can do this before it claims the device."""
    from gpulab.kernels.triton.config import parallel_compile
    from gpulab.kernels.triton.gemv import warm_gemv

    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device="meta")

    qkv, attn, norm = sum(dims.qkv_split), dims.n_heads * dims.head_dim, (meta(dims.hidden), dims.eps)
    token = meta(1, 1, dims.hidden)
    with parallel_compile():
        warm_gemv(token, meta(qkv, dims.hidden), meta(qkv), norm=norm, target=target)
        warm_gemv(meta(1, 1, attn), meta(dims.hidden, attn), residual=token, target=target)
        warm_gemv(token, meta(2 * dims.intermediate, dims.hidden), gated=True, norm=norm, target=target)
        warm_gemv(meta(1, 1, dims.intermediate), meta(dims.hidden, dims.intermediate), residual=token, target=target)
        warm_gemv(token, meta(dims.vocab, dims.hidden), norm=norm, target=target)


def _silu_mul(x: torch.Tensor) -> torch.Tensor:
    from gpulab.kernels.triton.gemv import silu_mul

    return silu_mul(x)


define_op("silu_mul", "(Tensor x) -> Tensor", _silu_mul, lambda x: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)))


Stream = tuple[torch.Tensor, torch.Tensor | None]  # the residual stream, and an output still to be added to it


def swiglu(x: torch.Tensor, norm: Norm, w13: torch.Tensor, wd: torch.Tensor) -> Stream:
    """``x + down(silu(gate(h)) * up(h))`` with ``h = rms_norm(x)``, as (x, down(...)): the sum is left to the next
    layer's norm, which adds it in its own pass. For one token on a GPU the norm, the gate and up products and the
    activation are one kernel, the down product and the residual another (nothing left to add). A prompt on a
    GPU takes the activation from Triton's :func:`~gpulab.kernels.triton.gemv.silu_mul`."""
    if _one_token_on_gpu(x):
        gated = torch.ops.gpulab_llm.gemv(x, w13, None, None, *norm, True)
        return torch.ops.gpulab_llm.gemv(gated, wd, None, x, None, 0.0, False), None
    product = F.linear(rms_norm(x, *norm), w13)
    if triton_decode(x.device):
        return x, F.linear(torch.ops.gpulab_llm.silu_mul(product), wd)
    gate, up = product.chunk(2, dim=-1)
    return x, F.linear(F.silu(gate) * up, wd)


def _rope_into_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                     cache_v: torch.Tensor, pos: torch.Tensor, heads: int) -> torch.Tensor:
    from gpulab.kernels.triton.decode_attention import rope_into_cache

    return rope_into_cache(qkv.contiguous(), cos.contiguous(), sin.contiguous(), cache_k, cache_v, pos.contiguous(),
                           heads)


define_op("rope_into_cache", "(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) cache_k, Tensor(b!) cache_v, "
          "Tensor pos, int heads) -> Tensor", _rope_into_cache,
          lambda qkv, cos, sin, cache_k, cache_v, pos, heads: qkv.new_empty((1, qkv.shape[1], heads,
                                                                             cache_k.shape[-1])))


def _split_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
              cache_v: torch.Tensor, pos: torch.Tensor, heads: int) -> torch.Tensor:
    from gpulab.kernels.triton.decode_attention import decode_attention as split_kv

    return split_kv(qkv.contiguous(), cos.contiguous(), sin.contiguous(), cache_k, cache_v, pos.contiguous(), heads)


define_op("split_kv_attention", "(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) cache_k, Tensor(b!) cache_v, "
          "Tensor pos, int heads) -> Tensor", _split_kv,
          lambda qkv, cos, sin, cache_k, cache_v, pos, heads: qkv.new_empty((1, 1, heads * cache_k.shape[-1])))


def decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
                     cache_v: torch.Tensor, pos: torch.Tensor, dims: Dims) -> torch.Tensor:
    """One new token at ``pos`` (a device tensor, so a captured graph replays every step): its K/V written
    into the static cache, then its query over positions 0..pos. On a GPU, Triton's split-KV kernel
    (:mod:`gpulab.kernels.triton.decode_attention`) does all of it, RoPE included, reading only positions
    0..pos, many programs per head. Elsewhere one fused SDPA call over the whole cache with later positions
    masked, a KV head's query heads as its query rows (no copies of K/V). Both keep scores, softmax and the
    weighted sum in float32, as flash attention does (bf16 scores of a 7B model's raw q·k, tens in size, lose
    ~0.1 each: 7% logit error after 28 layers on the H100)."""
    if split_kv_available(qkv.device, dims.head_dim):
        return torch.ops.gpulab_llm.split_kv_attention(qkv, cos, sin, cache_k, cache_v, pos, dims.n_heads)
    q, k, v = rotated_heads(qkv, cos, sin, dims)
    cache_k[:, :, pos] = k
    cache_v[:, :, pos] = v
    groups = dims.n_heads // dims.n_kv
    mask = (torch.arange(cache_k.shape[2], device=q.device) <= pos).view(1, -1)
    out = F.scaled_dot_product_attention(q.view(1, dims.n_kv, groups, dims.head_dim), cache_k, cache_v, attn_mask=mask)
    return out.view(1, 1, -1)


def layer(x: torch.Tensor, w: LayerWeights, dims: Dims, cache_k: torch.Tensor, cache_v: torch.Tensor,
          pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
          pending: torch.Tensor | None = None, last_only: bool = False) -> Stream:
    """One decoder layer over ``x + pending`` (1, T, hidden) at positions ``pos`` (T,), writing K/V into the
    cache: ``attend`` is :func:`prefill_attention` or :func:`decode_attention`. Returns the stream as
    :func:`swiglu` leaves it. The previous layer's ``pending`` output is added here, where a compiled layer
    fuses the sum into the norm's pass (a prompt's layer, compiled on its own, otherwise ended with a pass of its
    own for it). With ``last_only`` every position's K/V still goes into the cache, and the rest of the layer
    runs for the last position alone (a model's last layer, when only the next token is wanted)."""
    if pending is not None:
        x = x + pending
    qkv = linear(x, w.wqkv, w.bqkv, norm=(w.in_norm, dims.eps))
    attended = attend(qkv, cos, sin, cache_k, cache_v, pos, dims)
    if last_only:
        x, attended = x[:, -1:], attended[:, -1:]
    x = linear(attended, w.wo, residual=x)
    return swiglu(x, (w.post_norm, dims.eps), w.w13, w.wd)


def hidden(weights: Weights, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor, attend: Attend,
           run_layer: Callable[..., Stream] = layer, last_only: bool = False,
           after_layer: Callable[[int], None] | None = None) -> torch.Tensor:
    """The last layer's output (1, T, hidden) for ``ids`` (1, T) placed at ``pos`` (T,), the cache filled;
    ``run_layer`` is :func:`layer` or a compiled form of it. With ``last_only`` the output is the last position's
    (1, 1, hidden): the last layer runs past attention for that position alone (llama.cpp's prompt does the same),
    and uncompiled, as its products are then one-token ones. ``after_layer(index)`` is called after each layer."""
    embedded = F.embedding(ids, weights.embed)
    # The stream starts at zero with the embedding pending, so every layer takes the same arguments (a compiled
    # layer then serves the first layer too).
    x, pending = torch.zeros_like(embedded), embedded
    cos, sin = weights.cos[pos], weights.sin[pos]
    last = len(weights.layers) - 1
    for index, w in enumerate(weights.layers):
        args = (x, w, weights.dims, cache.k[index], cache.v[index], pos, cos, sin, attend, pending)
        x, pending = layer(*args, last_only=True) if last_only and index == last else run_layer(*args)
        if after_layer is not None:
            after_layer(index)
    return x if pending is None else x + pending


def logits(weights: Weights, x: torch.Tensor) -> torch.Tensor:
    """float32 logits (T, vocab) of the hidden states ``x`` (1, T, hidden); one position on a GPU is the fused
    Triton product, the final norm included."""
    if _one_token_on_gpu(x):
        return torch.ops.gpulab_llm.gemv(x, weights.lm_head, None, None, weights.norm, weights.dims.eps,
                                         False).float()[0]
    return F.linear(rms_norm(x, weights.norm, weights.dims.eps), weights.lm_head).float()[0]


def forward(weights: Weights, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor, attend: Attend,
            all_logits: bool = False) -> torch.Tensor:
    """float32 logits of the last position (or of every position) of ``ids`` (1, T) placed at ``pos`` (T,)."""
    return logits(weights, hidden(weights, cache, ids, pos, attend, last_only=not all_logits))
