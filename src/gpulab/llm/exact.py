"""Engine ``fast_exact``: the verifier. Bit-identical to transformers' eager forward, so its greedy tokens
equal ``generate``'s token for token, and still decoding from device graphs.

Products, RMSNorm and SiLU stay the eager ATen kernels (opaque custom ops), fused elementwise code rounds to bf16 after
every op, and transformers' attention runs eagerly between per-layer graphs; independent products may run on
parallel streams (``llm.fast_streams``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from gpulab.llm import qwen2
from gpulab.llm.fast import Decoder, State
from gpulab.llm.graphs import Graphs, GraphSettings
from gpulab.llm.study import Sampling

qwen2.define_op("linear", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
                lambda x, weight, bias: F.linear(x, weight, bias),
                lambda x, weight, bias: x.new_empty((*x.shape[:-1], weight.shape[0])))
qwen2.define_op("mean_last", "(Tensor x) -> Tensor", lambda x: x.mean(-1, keepdim=True),
                lambda x: x.new_empty((*x.shape[:-1], 1)))
qwen2.define_op("silu", "(Tensor x) -> Tensor", lambda x: F.silu(x), lambda x: torch.empty_like(x))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.gpulab_llm.linear(x, weight, bias) if torch.compiler.is_compiling() else F.linear(x, weight, bias)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.gpulab_llm.silu(x) if torch.compiler.is_compiling() else F.silu(x)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm, op for op (the mean an opaque op when compiled)."""
    h = x.to(torch.float32)
    square = h.pow(2)
    variance = torch.ops.gpulab_llm.mean_last(square) if torch.compiler.is_compiling() else square.mean(-1, True)
    return weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)


class ExactLayer(NamedTuple):
    """One layer's tensors as transformers holds them (its Q/K/V and gate/up views of the fused weights)."""

    in_norm: torch.Tensor
    wq: torch.Tensor
    bq: torch.Tensor
    wk: torch.Tensor
    bk: torch.Tensor
    wv: torch.Tensor
    bv: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    wg: torch.Tensor
    wu: torch.Tensor
    wd: torch.Tensor

    @classmethod
    def of(cls, layer: Any) -> ExactLayer:
        a, m = layer.self_attn, layer.mlp
        return cls(layer.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                   a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, layer.post_attention_layernorm.weight,
                   m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)


def _attention_function(model: Any) -> Callable[..., Any]:
    """The attention function transformers itself calls for this model (sdpa, eager, flash...)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    implementation = model.config._attn_implementation
    if implementation == "eager":
        return inspect.getmodule(type(model.model.layers[0].self_attn)).eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor; cos/sin are (1, T, head_dim)."""
    half = x.shape[-1] // 2
    return x * cos.unsqueeze(1) + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin.unsqueeze(1)


class Functions:
    """The step's pieces over static buffers, compiled (or not) once for every layer: weights are arguments."""

    def __init__(self, dims: qwen2.Dims, compiled: bool) -> None:
        self.dims = dims
        names = ("embed", "rope_cache", "post_attention", "post_mlp", "head")
        options = {"emulate_precision_casts": True}
        for name in names:
            fn = getattr(self, f"_{name}")
            setattr(self, name, torch.compile(fn, fullgraph=True, dynamic=False, options=options) if compiled else fn)

    def _embed(self, token: torch.Tensor, table: torch.Tensor, hidden: torch.Tensor, in_norm: torch.Tensor
               ) -> torch.Tensor:
        x = F.embedding(token, table)
        hidden.copy_(x)
        return _rms_norm(x, in_norm, self.dims.eps)

    def _rope_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_out: torch.Tensor) -> None:
        hd = self.dims.head_dim
        q = _rope(q.view(1, 1, -1, hd).transpose(1, 2), cos, sin)
        k_cache[:, :, pos] = _rope(k.view(1, 1, -1, hd).transpose(1, 2), cos, sin)
        v_cache[:, :, pos] = v.view(1, 1, -1, hd).transpose(1, 2)
        q_out.copy_(q)

    def _post_attention(self, hidden: torch.Tensor, attn: torch.Tensor, wo: torch.Tensor, post_norm: torch.Tensor
                        ) -> torch.Tensor:
        x = hidden + _linear(attn, wo)
        hidden.copy_(x)
        return _rms_norm(x, post_norm, self.dims.eps)

    def _post_mlp(self, hidden: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, wd: torch.Tensor,
                  next_norm: torch.Tensor) -> torch.Tensor:
        x = hidden + _linear(_silu(gate) * up, wd)
        hidden.copy_(x)
        return _rms_norm(x, next_norm, self.dims.eps)

    def _head(self, h: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return _linear(h, lm_head).float()[0]


class ExactDecoder(Decoder):
    """Bit-exact static-cache generation of one sequence over a transformers Qwen2ForCausalLM (batch 1)."""

    exact = True

    def __init__(self, model: Any, max_len: int, eos_ids: list[int], settings: GraphSettings, streams: str) -> None:
        self.model, self.max_len = model, max_len
        if torch.cuda.is_available():
            # cuDNN's SDPA builds an execution plan for every new key length (~60 ms each on an H100): a decode
            # that grows the cache one position a step pays it every step it reaches a new length. Flash
            # attention has no plans; transformers' calls in this process (the reference) use it too.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.dims = qwen2.Dims.of(model.config)
        self.base = qwen2.Weights.of(model, max_len)  # embedding, norms, rotary tables (and the fused views)
        self.layers = [ExactLayer.of(layer) for layer in model.model.layers]
        self.modules = [layer.self_attn for layer in model.model.layers]
        self.attention = _attention_function(model)
        dev, dt = self.base.lm_head.device, self.base.lm_head.dtype
        self.device = dev
        self.cache = qwen2.KVCache(self.dims, max_len, dt, dev)
        self.state = State.empty(max_len, self.dims.vocab, eos_ids, dev)
        self.hidden = torch.zeros(1, 1, self.dims.hidden, dtype=dt, device=dev)
        self.q = torch.zeros(1, self.dims.n_heads, 1, self.dims.head_dim, dtype=dt, device=dev)
        self.attn = torch.zeros(1, 1, self.dims.n_heads * self.dims.head_dim, dtype=dt, device=dev)
        self.fns = Functions(self.dims, settings.compile)
        self.streams = ([torch.cuda.Stream(dev) for _ in range(2)]
                        if settings.graphs and dev.type == "cuda" and streams != "none" else [])
        self.parallel_mlp = streams == "qkv_mlp"
        self.host_pos = 0
        self.graphs = Graphs(settings, dev, self._segments, self._between, self._snapshot, self._restore,
                             self._fallback, "device graphs per layer segment, transformers' attention between")
        self.logits = torch.zeros(1, self.dims.vocab, device=dev)
        self.chosen = torch.zeros(1, dtype=torch.long, device=dev)

    def _fallback(self) -> None:
        self.fns, self.streams = Functions(self.dims, False), []

    def _linears(self, h: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor | None]) -> list[torch.Tensor]:
        """Independent projections of ``h`` (eager ATen, transformers' kernels), concurrent on side streams."""
        if not self.streams:
            return [F.linear(h, w, b) for w, b in pairs]
        main, side = torch.cuda.current_stream(), self.streams[: len(pairs) - 1]
        for stream in side:  # fork before anything is enqueued on main, or the side streams would wait for it
            stream.wait_stream(main)
        outs = [F.linear(h, *pairs[0])]
        for stream, (w, b) in zip(side, pairs[1:], strict=True):
            with torch.cuda.stream(stream):
                outs.append(F.linear(h, w, b))
        for stream in side:
            main.wait_stream(stream)
        return outs

    def _segments(self, sampling: Sampling) -> list[Callable[[], Any]]:
        return [lambda i=i: self._segment(i, sampling) for i in range(self.dims.n_layers + 1)]

    def _after_attention(self, index: int) -> torch.Tensor:
        """The rest of layer ``index`` after its attention, up to the next layer's (or the final) norm."""
        p, fns = self.layers[index], self.fns
        last = index == self.dims.n_layers - 1
        next_norm = self.base.norm if last else self.layers[index + 1].in_norm
        h2 = fns.post_attention(self.hidden, self.attn, p.wo, p.post_norm)
        if self.parallel_mlp:
            gate, up = self._linears(h2, (p.wg, None), (p.wu, None))
        else:
            gate, up = F.linear(h2, p.wg), F.linear(h2, p.wu)
        return fns.post_mlp(self.hidden, gate, up, p.wd, next_norm)

    def _segment(self, index: int, sampling: Sampling) -> Any:
        """Segment ``index``: the embedding (0) or the end of layer index-1, then layer ``index`` up to its
        attention; the last segment ends with the head and the token choice."""
        s = self.state
        if index == 0:
            h = self.fns.embed(s.token, self.base.embed, self.hidden, self.layers[0].in_norm)
        else:
            h = self._after_attention(index - 1)
        if index == self.dims.n_layers:
            logits = self.fns.head(h, self.base.lm_head)
            return logits, s.advance(logits, sampling)
        w = self.layers[index]
        q, k, v = self._linears(h, (w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv))
        cos, sin = self.base.cos.index_select(0, s.pos)[None], self.base.sin.index_select(0, s.pos)[None]
        self.fns.rope_cache(q, k, v, cos, sin, s.pos, self.cache.k[index], self.cache.v[index], self.q)
        return None

    def _attend(self, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        module = self.modules[index]
        out, _ = self.attention(module, q, k, v, None, dropout=0.0, scaling=module.scaling,
                                sliding_window=getattr(module, "sliding_window", None))
        return out

    def _between(self, index: int) -> None:
        """transformers' attention over the first host_pos+1 cache positions (what its dynamic cache holds)."""
        length = self.host_pos + 1
        k, v = self.cache.k[index][:, :, :length], self.cache.v[index][:, :, :length]
        self.attn.copy_(self._attend(index, self.q, k, v).reshape(self.attn.shape))

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, sampling: Sampling, all_logits: bool = False) -> torch.Tensor:
        """The prompt through transformers' own operations, in one batch; chooses the next token."""
        length = self._start(ids)
        if length == 1:  # a one-token prompt is exactly a decode step at position 0, as transformers computes it
            self.state.token.fill_(int(ids.view(-1)[0]))
            self.state.pos.zero_()
            self.host_pos = 0
            self.step(sampling)
            return self.logits
        logits = self._prefill_logits(ids.to(self.device), all_logits)
        self._first_choice(logits, sampling, length)
        return logits

    def _prefill_logits(self, ids: torch.Tensor, all_logits: bool) -> torch.Tensor:
        length, eps, hd = int(ids.numel()), self.dims.eps, self.dims.head_dim
        x = F.embedding(ids.view(1, -1), self.base.embed)
        cos, sin = self.base.cos[:length][None], self.base.sin[:length][None]
        for index, w in enumerate(self.layers):
            h = _rms_norm(x, w.in_norm, eps)
            q = _rope(F.linear(h, w.wq, w.bq).view(1, length, -1, hd).transpose(1, 2), cos, sin)
            k = _rope(F.linear(h, w.wk, w.bk).view(1, length, -1, hd).transpose(1, 2), cos, sin)
            v = F.linear(h, w.wv, w.bv).view(1, length, -1, hd).transpose(1, 2)
            self.cache.k[index][:, :, :length] = k
            self.cache.v[index][:, :, :length] = v
            # transformers' dynamic cache hands attention contiguous copies of k and v
            out = self._attend(index, q, k.contiguous(), v.contiguous())
            x = x + F.linear(out.reshape(1, length, -1).contiguous(), w.wo)
            h = _rms_norm(x, w.post_norm, eps)
            x = x + F.linear(F.silu(F.linear(h, w.wg)) * F.linear(h, w.wu), w.wd)
        x = x if all_logits else x[:, -1:]
        return F.linear(_rms_norm(x, self.base.norm, eps), self.base.lm_head).float()[0]
