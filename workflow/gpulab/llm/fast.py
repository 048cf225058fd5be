"""Engine ``fast``: a gpt-fast-style decode path over the weights of a loaded transformers Qwen2 model.

- A static KV cache (one ``(kv_heads, max_len, head_dim)`` buffer per layer and for K and V), allocated once.
- Prefill of the whole prompt runs eagerly, separate from decoding.
- The one-token decode step is a chain of functions compiled with ``torch.compile`` (one compilation
  serves every layer: the weights are arguments) and captured in CUDA/HIP graphs, so a step costs one
  graph launch per layer instead of ~1000 kernel launches from Python.
- Independent products (Q/K/V, gate/up) run on parallel streams inside the graphs, so the small K and V
  products hide behind Q's (same kernels, same results).
- The next token is chosen on the device (:mod:`gpulab.llm.sampling`) and written into a device-side
  token buffer: the host never waits for a token while decoding (except every ``check_every`` steps when
  it must stop at an end-of-sequence token).

Numerics. transformers' greedy output is the reference, and a random-weight model has near-ties in
almost every step, so a one-bit difference anywhere soon changes a token. In ``exact`` mode (the
default) every operation gives bit-identical results to transformers' eager forward: matrix products,
the RMSNorm mean and SiLU stay the eager ATen kernels (wrapped as opaque custom ops so inductor cannot
re-associate them), the fused elementwise code rounds to bf16 after every op as eager does
(``emulate_precision_casts``), and attention is transformers' own attention function over the exact
cache length (run between two graphs, because its length changes every step). ``exact=False`` instead
runs a fixed-length masked attention inside a single whole-step graph: close to transformers but not
bit-identical, and measured no faster (H100, Qwen2.5-7B architecture: 139 against 144 tok/s).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from gpulab.llm.sampling import next_token
from gpulab.llm.study import Sampling

log = logging.getLogger(__name__)


def _define_op(name: str, schema: str, impl: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]) -> None:
    if hasattr(torch.ops.gpulab_llm, name):  # already registered in this process
        return
    op = torch.library.custom_op(f"gpulab_llm::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)


_define_op("linear", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
           lambda x, weight, bias: F.linear(x, weight, bias),
           lambda x, weight, bias: x.new_empty((*x.shape[:-1], weight.shape[0])))
_define_op("mean_last", "(Tensor x) -> Tensor",
           lambda x: x.mean(-1, keepdim=True),
           lambda x: x.new_empty((*x.shape[:-1], 1)))
_define_op("silu", "(Tensor x) -> Tensor", lambda x: F.silu(x), lambda x: torch.empty_like(x))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.gpulab_llm.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, exact: bool) -> torch.Tensor:
    """transformers' Qwen2RMSNorm, op for op."""
    dtype = x.dtype
    h = x.to(torch.float32)
    square = h.pow(2)
    if exact and torch.compiler.is_compiling():
        variance = torch.ops.gpulab_llm.mean_last(square)
    else:
        variance = square.mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb (rotate-half form), op for op; cos/sin are (batch, seq, head_dim)."""

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def _silu(x: torch.Tensor, exact: bool) -> torch.Tensor:
    if exact and torch.compiler.is_compiling():
        return torch.ops.gpulab_llm.silu(x)
    return F.silu(x)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, the very parameters of the transformers model (no copies)."""

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
    def of(cls, layer: Any) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        return cls(layer.input_layernorm.weight, attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight,
                   attn.k_proj.bias, attn.v_proj.weight, attn.v_proj.bias, attn.o_proj.weight,
                   layer.post_attention_layernorm.weight, mlp.gate_proj.weight, mlp.up_proj.weight,
                   mlp.down_proj.weight)


@dataclass(frozen=True)
class FastOptions:
    compile: bool
    graphs: bool
    exact: bool = True
    parallel: bool = True  # Q, K and V products on three streams (device graphs only)
    parallel_mlp: bool = True  # gate and up products on two streams as well
    check_every: int = 16  # steps between end-of-sequence checks when generation may stop early

    def describe(self) -> str:
        parts = ["static KV cache", "eager prefill"]
        parts.append("torch.compile decode step" if self.compile else "eager decode step")
        if self.graphs:
            parts.append("device graphs per layer segment" if self.exact else "one device graph per step")
            if self.parallel:
                parts.append("Q/K/V" + (" and gate/up" if self.parallel_mlp else "") + " products on parallel streams")
        parts.append("bit-exact numerics" if self.exact else "fused numerics")
        return ", ".join(parts)


def _attention_function(model: Any) -> Callable[..., Any]:
    """The attention function transformers itself calls for this model (sdpa, eager, flash...)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modeling = inspect.getmodule(type(model.model.layers[0].self_attn))
    implementation = model.config._attn_implementation
    if implementation == "eager":
        return modeling.eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


class FastQwen2:
    """Static-cache generation for one sequence over a transformers Qwen2ForCausalLM (batch 1)."""

    def __init__(self, model: Any, max_len: int, options: FastOptions, eos_ids: list[int]) -> None:
        config = model.config
        if config.model_type != "qwen2" or config.hidden_act != "silu":
            raise ValueError(f"engine fast implements Qwen2 (silu) decoders, not "
                             f"{config.model_type}/{config.hidden_act}")
        if any(t != "full_attention" for t in getattr(config, "layer_types", ["full_attention"])):
            raise ValueError("engine fast implements full attention only (Qwen2.5 disables sliding windows)")
        self.model = model
        self.options = options
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.max_len = max_len
        self.layers = list(model.model.layers)
        self.weights = [LayerWeights.of(layer) for layer in self.layers]
        self.eps = float(config.rms_norm_eps)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv = int(config.num_key_value_heads)
        self.hidden_size = int(config.hidden_size)
        self.vocab = int(model.lm_head.weight.shape[0])
        self.rope = _rope
        self.attention = _attention_function(model)
        dev, dt = self.device, self.dtype
        with torch.no_grad():
            # cos/sin of every position from the model's own rotary module: the values it computes per step.
            positions = torch.arange(max_len, device=dev)[None]
            cos, sin = model.model.rotary_emb(torch.empty(1, dtype=dt, device=dev), positions)
        self.cos_table, self.sin_table = cos[0].contiguous(), sin[0].contiguous()
        shape = (self.n_kv, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=dt, device=dev) for _ in self.layers]
        # Device-side state of the sequence: every buffer a captured graph reads or writes lives here.
        self.tokens = torch.zeros(max_len, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)  # index of the token fed next
        self.presence = torch.zeros(self.vocab, dtype=torch.bool, device=dev)
        self.done = torch.zeros(1, dtype=torch.bool, device=dev)
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], dtype=torch.long, device=dev)
        self.positions = torch.arange(max_len, device=dev)
        self.hidden = torch.zeros(1, 1, self.hidden_size, dtype=dt, device=dev)
        self.cos = torch.zeros(1, 1, self.head_dim, dtype=dt, device=dev)
        self.sin = torch.zeros(1, 1, self.head_dim, dtype=dt, device=dev)
        self.q = torch.zeros(1, self.n_heads, 1, self.head_dim, dtype=dt, device=dev)
        self.attn = torch.zeros(1, 1, self.n_heads * self.head_dim, dtype=dt, device=dev)
        self.host_pos = 0  # the host's copy of pos: it launched every step, so it needs no synchronisation
        self.compile_error = ""
        self._fns = self._functions(options.compile)
        self._graphs: dict[Any, list[torch.cuda.CUDAGraph]] = {}
        self._pool = torch.cuda.graph_pool_handle() if options.graphs else None
        self._streams = [torch.cuda.Stream(dev) for _ in range(2)] if options.graphs and options.parallel else []

    # -- the decode step, as functions over static buffers ------------------------------------------------

    def _functions(self, compiled: bool) -> dict[str, Callable[..., Any]]:
        exact, eps, rope = self.options.exact, self.eps, self.rope
        n_heads, n_kv, head_dim = self.n_heads, self.n_kv, self.head_dim
        groups, scale = n_heads // n_kv, head_dim ** -0.5

        def embed(tokens, pos, table, cos_table, sin_table, hidden, cos, sin, in_norm):
            token = tokens.index_select(0, pos)
            x = F.embedding(token, table).view(hidden.shape)
            hidden.copy_(x)
            cos.copy_(cos_table.index_select(0, pos).view(cos.shape))
            sin.copy_(sin_table.index_select(0, pos).view(sin.shape))
            return _rms_norm(x, in_norm, eps, exact)

        def rope_cache(q, k, v, cos, sin, pos, k_cache, v_cache, q_out):
            q = q.view(1, 1, -1, head_dim).transpose(1, 2)
            k = k.view(1, 1, -1, head_dim).transpose(1, 2)
            v = v.view(1, 1, -1, head_dim).transpose(1, 2)
            q, k = rope(q, k, cos, sin)
            k_cache[:, pos] = k[0]
            v_cache[:, pos] = v[0]
            q_out.copy_(q)

        def masked_attention(q, pos, positions, k_cache, v_cache, attn_out):
            # Fixed-length attention over the whole cache, later positions masked: graph-capturable.
            qg = q.view(n_kv, groups, head_dim).float()
            scores = torch.matmul(qg, k_cache.float().transpose(1, 2)) * scale
            scores = scores.masked_fill((positions > pos).view(1, 1, -1), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attn_out.copy_(torch.matmul(probs, v_cache.float()).to(attn_out.dtype).view(attn_out.shape))

        def post_attention(hidden, attn, wo, post_norm, wg, wu, wd, next_norm):
            # From one layer's attention output to the next layer's normed input (or the final norm): the
            # residual adds fuse with the norms.
            x = hidden + _linear(attn, wo)
            h = _rms_norm(x, post_norm, eps, exact)
            x = x + _linear(_silu(_linear(h, wg), exact) * _linear(h, wu), wd)
            hidden.copy_(x)
            return _rms_norm(x, next_norm, eps, exact)

        def post_attention_norm(hidden, attn, wo, post_norm):
            x = hidden + _linear(attn, wo)
            hidden.copy_(x)
            return _rms_norm(x, post_norm, eps, exact)

        def post_mlp(hidden, gate, up, wd, next_norm):
            x = hidden + _linear(_silu(gate, exact) * up, wd)
            hidden.copy_(x)
            return _rms_norm(x, next_norm, eps, exact)

        def head(h, lm_head):
            return _linear(h, lm_head).float()[:, -1]

        fns = {"embed": embed, "rope_cache": rope_cache, "masked_attention": masked_attention,
               "post_attention": post_attention, "post_attention_norm": post_attention_norm, "post_mlp": post_mlp,
               "head": head}
        if not compiled:
            return fns
        options = {"emulate_precision_casts": True} if exact else {}
        return {name: torch.compile(fn, fullgraph=True, dynamic=False, options=options) for name, fn in fns.items()}

    def _linears(self, h: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor | None]) -> list[torch.Tensor]:
        """Independent projections of ``h`` (eager ATen, the same kernels transformers runs); with side
        streams they run concurrently, so the small K and V products hide behind Q's."""
        if not self._streams or len(pairs) < 2:
            return [F.linear(h, w, b) for w, b in pairs]
        main = torch.cuda.current_stream()
        side = self._streams[: len(pairs) - 1]
        for stream in side:  # fork before anything is enqueued on main, or the side streams would wait for it
            stream.wait_stream(main)
        outs = [F.linear(h, *pairs[0])]
        for stream, (w, b) in zip(side, pairs[1:], strict=True):
            with torch.cuda.stream(stream):
                outs.append(F.linear(h, w, b))
        for stream in side:
            main.wait_stream(stream)
        return outs

    def _segment(self, index: int, sampling: Sampling | None) -> None:
        """Segment ``index`` of a step: the embedding (index 0) or the rest of layer index-1 after its
        attention, then layer ``index`` up to its attention, or the head and the token choice (last)."""
        fns, last, o = self._fns, len(self.layers), self.options
        if index == 0:
            h = fns["embed"](self.tokens, self.pos, self.model.model.embed_tokens.weight, self.cos_table,
                             self.sin_table, self.hidden, self.cos, self.sin, self.weights[0].in_norm)
        else:
            p = self.weights[index - 1]
            next_norm = self.weights[index].in_norm if index < last else self.model.model.norm.weight
            if o.parallel_mlp and self._streams:
                h2 = fns["post_attention_norm"](self.hidden, self.attn, p.wo, p.post_norm)
                gate, up = self._linears(h2, (p.wg, None), (p.wu, None))
                h = fns["post_mlp"](self.hidden, gate, up, p.wd, next_norm)
            else:
                h = fns["post_attention"](self.hidden, self.attn, p.wo, p.post_norm, p.wg, p.wu, p.wd, next_norm)
        if index == last:
            self._advance(fns["head"](h, self.model.lm_head.weight), sampling)
            return
        w = self.weights[index]
        q, k, v = self._linears(h, (w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv))
        fns["rope_cache"](q, k, v, self.cos, self.sin, self.pos, self.k_cache[index], self.v_cache[index], self.q)
        if not o.exact:
            fns["masked_attention"](self.q, self.pos, self.positions, self.k_cache[index], self.v_cache[index],
                                    self.attn)

    def _exact_attention(self, index: int, length: int) -> None:
        """transformers' attention function, called as Qwen2Attention calls it, over the first ``length``
        cache positions (the same shapes and values as its own dynamic cache holds)."""
        module = self.layers[index].self_attn
        k = self.k_cache[index][:, :length].unsqueeze(0)
        v = self.v_cache[index][:, :length].unsqueeze(0)
        out, _ = self.attention(module, self.q, k, v, None, dropout=0.0, scaling=module.scaling,
                                sliding_window=getattr(module, "sliding_window", None))
        self.attn.copy_(out.reshape(self.attn.shape))

    def _advance(self, logits: torch.Tensor, sampling: Sampling) -> None:
        token = next_token(logits, self.presence, sampling)
        self.tokens.index_copy_(0, self.pos + 1, token)
        self.presence.index_fill_(0, token, True)
        self.done.logical_or_((token.view(-1, 1) == self.eos.view(1, -1)).any(-1))
        self.pos.add_(1)

    def _step_eager(self, sampling: Sampling) -> None:
        length = self.host_pos + 1
        for index in range(len(self.layers) + 1):
            self._segment(index, sampling)
            if self.options.exact and index < len(self.layers):
                self._exact_attention(index, length)
        self.host_pos += 1

    # -- device graphs -----------------------------------------------------------------------------------

    def _state(self) -> tuple[list[torch.Tensor], int]:
        return [t.clone() for t in (self.tokens, self.pos, self.presence, self.done)], self.host_pos

    def _restore(self, state: tuple[list[torch.Tensor], int]) -> None:
        saved, self.host_pos = state
        for tensor, value in zip((self.tokens, self.pos, self.presence, self.done), saved, strict=True):
            tensor.copy_(value)

    def _warm(self, sampling: Sampling) -> None:
        """Two untimed steps (compilation and library handles happen here); the sequence state is restored.
        The cache positions they write are rewritten by the next prefill."""
        state = self._state()
        if self.options.graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step_eager(sampling)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
        else:
            for _ in range(2):
                self._step_eager(sampling)
        self._restore(state)

    def _capture(self, sampling: Sampling) -> list[torch.cuda.CUDAGraph]:
        """Warm up, then capture the step's graphs (capturing records kernels without running them)."""
        self._warm(sampling)
        graphs = []
        segments = range(len(self.layers) + 1) if self.options.exact else [None]
        for index in segments:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                if index is None:
                    for i in range(len(self.layers) + 1):
                        self._segment(i, sampling)
                else:
                    self._segment(index, sampling)
            graphs.append(graph)
        torch.cuda.synchronize()
        return graphs

    @torch.no_grad()
    def prepare(self, *samplings: Sampling) -> None:
        """Compile and capture ahead of time, so no measured call pays for it. A failure falls back step by
        step (no side streams, then no compilation, then no graphs), recorded in :attr:`compile_error`."""
        for sampling in samplings:
            while True:
                try:
                    if self.options.graphs:
                        self._graphs_for(sampling)
                    elif self.options.compile:
                        self._warm(sampling)
                    break
                except Exception as exc:  # an inductor, Triton or capture failure must not lose the measurement
                    o = self.options
                    if o.graphs and (o.parallel or o.parallel_mlp):
                        what, fallback = "parallel streams", replace(o, parallel=False, parallel_mlp=False)
                    elif o.compile:
                        what, fallback = "torch.compile", replace(o, compile=False)
                    elif o.graphs:
                        what, fallback = "graph capture", replace(o, graphs=False)
                    else:
                        raise
                    message = f"{what} failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
                    self.compile_error = "; ".join(filter(None, [self.compile_error, message]))
                    log.warning("%s; falling back", message)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    self.options = fallback
                    self._streams = self._streams if fallback.parallel else []
                    self._fns = self._functions(fallback.compile)
                    self._graphs.clear()

    def _graphs_for(self, sampling: Sampling) -> list[torch.cuda.CUDAGraph]:
        key = sampling
        if key not in self._graphs:
            self._graphs[key] = self._capture(sampling)
        return self._graphs[key]

    def _step(self, sampling: Sampling) -> None:
        if not self.options.graphs:
            self._step_eager(sampling)
            return
        graphs = self._graphs_for(sampling)
        if not self.options.exact:
            graphs[0].replay()
        else:
            length = self.host_pos + 1
            for index, graph in enumerate(graphs):
                graph.replay()
                if index < len(self.layers):
                    self._exact_attention(index, length)
        self.host_pos += 1

    # -- generation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, sampling: Sampling) -> None:
        """Run the prompt (1-D ids) through the model, fill the cache, choose the first new token."""
        length = int(ids.numel())
        if length < 1 or length >= self.max_len:
            raise ValueError(f"prompt of {length} tokens does not fit a cache of {self.max_len}")
        ids = ids.to(self.device).view(1, -1)
        self.tokens.zero_()
        self.tokens[:length] = ids[0]
        self.presence.zero_()
        self.presence[ids[0]] = True
        self.done.zero_()
        if length == 1:
            # A one-token prompt is exactly a decode step at position 0 (transformers computes it the same way).
            self.pos.zero_()
            self.host_pos = 0
            self._step(sampling)
            return
        exact = self.options.exact
        x = F.embedding(ids, self.model.model.embed_tokens.weight)
        cos, sin = self.cos_table[:length][None], self.sin_table[:length][None]
        for index, (layer, w) in enumerate(zip(self.layers, self.weights, strict=True)):
            h = _rms_norm(x, w.in_norm, self.eps, exact)
            q = F.linear(h, w.wq, w.bq).view(1, length, -1, self.head_dim).transpose(1, 2)
            k = F.linear(h, w.wk, w.bk).view(1, length, -1, self.head_dim).transpose(1, 2)
            v = F.linear(h, w.wv, w.bv).view(1, length, -1, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            self.k_cache[index][:, :length] = k[0]
            self.v_cache[index][:, :length] = v[0]
            module = layer.self_attn
            # transformers' dynamic cache hands attention contiguous copies of k and v
            out, _ = self.attention(module, q, k.contiguous(), v.contiguous(), None, dropout=0.0,
                                    scaling=module.scaling, sliding_window=getattr(module, "sliding_window", None))
            x = x + F.linear(out.reshape(1, length, -1).contiguous(), w.wo)
            h = _rms_norm(x, w.post_norm, self.eps, exact)
            x = x + F.linear(F.silu(F.linear(h, w.wg)) * F.linear(h, w.wu), w.wd)
        h = _rms_norm(x, self.model.model.norm.weight, self.eps, exact)
        logits = F.linear(h[:, -1:, :], self.model.lm_head.weight).float()[:, -1]
        self.pos.fill_(length - 1)
        self._advance(logits, sampling)
        self.host_pos = length

    @torch.no_grad()
    def decode(self, steps: int, sampling: Sampling, stop_at_eos: bool = False) -> int:
        """Up to ``steps`` more tokens; returns how many steps ran (the host syncs only to check for EOS)."""
        steps = min(steps, self.max_len - 1 - self.host_pos)
        done = 0
        while done < steps:
            chunk = min(self.options.check_every if stop_at_eos else steps, steps - done)
            for _ in range(chunk):
                self._step(sampling)
            done += chunk
            if stop_at_eos and bool(self.done.item()):
                break
        return done

    def generated(self, prompt_len: int) -> torch.Tensor:
        """Tokens after the prompt, up to the current position (a host copy: this synchronises)."""
        return self.tokens[prompt_len:self.host_pos + 1].cpu()

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, sampling: Sampling, stop_at_eos: bool = True
                 ) -> torch.Tensor:
        """Prefill then decode: at most ``max_new_tokens`` new ids (through the first EOS when stopping)."""
        self.prefill(ids, sampling)
        if max_new_tokens > 1 and not (stop_at_eos and bool(self.done.item())):
            self.decode(max_new_tokens - 1, sampling, stop_at_eos)
        out = self.generated(int(ids.numel()))[:max_new_tokens]
        if stop_at_eos:
            hits = (out.view(-1, 1) == self.eos.cpu().view(1, -1)).any(-1).nonzero()
            if hits.numel():
                out = out[: int(hits[0, 0]) + 1]
        return out
