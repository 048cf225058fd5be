"""Engine ``hf_compiled``'s generation: transformers' ``generate`` over one static KV cache, whose decode step
transformers compiles itself (``torch.compile``, mode ``reduce-overhead``: CUDA graphs), the fast path its
documentation recommends. One cache for every call, filled once eagerly so its addresses are static, reset
before each call; teacher forcing runs through the same ``generate`` call, a logits processor forcing the tokens.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import CompileConfig, LogitsProcessor, LogitsProcessorList, StaticCache

from gpulab.llm.study import Sampling

# The compile modes of the decode step: transformers' default (CUDA graphs), or without them (no GPU, llm.graphs off).
GRAPHS_MODE, NO_GRAPHS_MODE = "reduce-overhead", "default"


class Forcing(LogitsProcessor):
    """Records each step's logits (a float32 copy: a later step cannot overwrite it) and forces the next token."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.rows: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.rows.append(scores[0].to(torch.float32, copy=True))
        step = len(self.rows) - 1
        if step >= len(self.tokens):
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.tokens[step]] = 0.0
        return forced


class StaticGenerate:
    """``generate`` of one sequence (batch 1) over a static cache of ``max_len`` positions, the decode step
    compiled where ``compile_step`` asks for it."""

    def __init__(self, model: Any, max_len: int, compile_step: bool, graphs: bool, pad_token_id: int | None) -> None:
        self.model, self.max_len, self.pad_token_id = model, max_len, pad_token_id
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        # transformers 5.x renames the cache argument (past_key_values, then cache)
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        device = model.lm_head.weight.device
        self.compiled = compile_step
        self.compile_config = CompileConfig(mode=GRAPHS_MODE if graphs else NO_GRAPHS_MODE)
        if device.type == "cpu":
            # transformers' own switch for compiling on a CPU: its generate compiles on an accelerator only
            self.compile_config._compile_all_devices = True
        with torch.no_grad():
            # A cache first filled inside a compiled region is not marked static: the CUDA graphs would pool its
            # tensors and overwrite them on the next replay. One eager step allocates them here.
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=True,
                  **{self.cache_kw: self.cache})
        # The length counters the compiled step reads in place (transformers versions with a tensor counter)
        self.lengths = [getattr(layer, "cumulative_length", None) for layer in self.cache.layers]
        self.empty()

    def empty(self) -> None:
        """The cache emptied, every tensor at its address: a reset that rebinds a tensor length counter (the
        older layers' reset sets the attribute to 0) would leave the compiled step reading another one, so the
        counter is put back, zeroed."""
        self.cache.reset()
        for layer, length in zip(self.cache.layers, self.lengths, strict=True):
            if isinstance(length, torch.Tensor) and layer.cumulative_length is not length:
                layer.cumulative_length = length.zero_()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.cache.layers for t in (layer.keys, layer.values))

    def _call_kwargs(self) -> dict[str, Any]:
        """The cache, emptied, and the compile settings, for one call; a new step for the CUDA graphs, so no output
        of an earlier call is taken for a live one."""
        self.empty()
        if not self.compiled:
            return {self.cache_kw: self.cache, "disable_compile": True}
        torch.compiler.cudagraph_mark_step_begin()
        return {self.cache_kw: self.cache, "compile_config": self.compile_config}

    def prefill(self, ids: torch.Tensor) -> None:
        """transformers' prefill into the emptied cache (eager: transformers never compiles the prefill)."""
        self.empty()
        with torch.no_grad():
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_kw: self.cache})

    def generate(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        with torch.no_grad():
            return self.model.generate(ids, **kwargs, **self._call_kwargs())

    def teacher(self, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and greedy choices of positions ``split - 1`` to the end of ``ids`` (1-D): its first ``split``
        tokens the prompt, then one decode step per given token."""
        if ids.numel() >= self.max_len:
            raise ValueError(f"teacher forcing {ids.numel()} tokens needs a cache longer than {self.max_len}")
        forcing = Forcing(ids[split:].tolist())
        prompt = ids[:split].view(1, -1)
        # No end of sequence: a forced token that is one must not stop the run.
        self.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=int(ids.numel()) - split + 1,
                      eos_token_id=None, pad_token_id=self.pad_token_id,
                      logits_processor=LogitsProcessorList([forcing]), **Sampling.greedy().generate_kwargs())
        logits = torch.stack(forcing.rows).cpu()
        return logits, logits.argmax(-1)
