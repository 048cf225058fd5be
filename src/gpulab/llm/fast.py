"""Engine ``fast`` (gpt-fast's design): a batched prefill captured in device graphs and a compiled
:func:`decode_one_token` whose whole step, the token choice included, is ONE device graph per sampling setting.

Every buffer the graph touches lives in :class:`State`, so decoding is replay after replay with no host work, but a
look at the end-of-sequence flag every ``CHECK_EVERY`` steps. Numerics differ from transformers in rounding only,
checked by teacher forcing (:mod:`gpulab.llm.checks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from gpulab.llm import qwen2
from gpulab.llm.graphs import Graphs, GraphSettings, LengthGraphs
from gpulab.llm.sampling import next_token
from gpulab.llm.study import Sampling

log = logging.getLogger(__name__)

CHECK_EVERY = 16  # decode steps between end-of-sequence checks (the only host synchronisations)
# Layers in a prompt's first device graph: few enough that it launches at once, enough that the device is still
# running them when the host has launched the graph of the other layers.
FIRST_GRAPH_LAYERS = 4


@dataclass
class State:
    """Device-side state of the one sequence being generated."""

    token: torch.Tensor  # (1, 1) the token fed next
    pos: torch.Tensor  # (1,) its position
    tokens: torch.Tensor  # (max_len,) the prompt and every chosen token
    presence: torch.Tensor  # (vocab,) bool: ids seen so far (repetition penalty)
    done: torch.Tensor  # (1,) bool: an end-of-sequence token was chosen
    eos: torch.Tensor  # end-of-sequence ids

    @classmethod
    def empty(cls, max_len: int, vocab: int, eos_ids: list[int], device: torch.device) -> State:
        long = {"dtype": torch.long, "device": device}
        return cls(torch.zeros(1, 1, **long), torch.zeros(1, **long), torch.zeros(max_len, **long),
                   torch.zeros(vocab, dtype=torch.bool, device=device), torch.zeros(1, dtype=torch.bool, device=device),
                   torch.tensor(sorted(set(eos_ids)) or [-1], **long))

    def start(self, ids: torch.Tensor) -> None:
        """A new sequence of prompt ``ids`` (1-D, on the device): device work only, so a prefill's graph holds it."""
        self.tokens.zero_()
        self.tokens[: ids.numel()].copy_(ids)
        self.presence.zero_()
        self.presence.index_fill_(0, ids, True)
        self.done.zero_()

    def advance(self, logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        """Choose the token after ``pos`` on the device and make it the next input."""
        chosen = next_token(logits, self.presence, sampling)
        self.pos.add_(1)
        self.tokens.index_copy_(0, self.pos, chosen)
        self.presence.index_fill_(0, chosen, True)
        self.done.logical_or_((chosen.view(-1, 1) == self.eos.view(1, -1)).any(-1))
        self.token.copy_(chosen.view(1, 1))
        return chosen


def decode_one_token(weights: qwen2.Weights, cache: qwen2.KVCache, token: torch.Tensor, pos: torch.Tensor
                     ) -> torch.Tensor:
    """float32 logits (1, vocab) after ``token`` (1, 1) at ``pos`` (1,)."""
    return qwen2.forward(weights, cache, token, pos, qwen2.decode_attention)


class Decoder:
    """What both static-cache decoders share: the sequence state around prefill and steps, generation,
    and teacher forcing. Subclasses set ``state``, ``graphs``, ``device``, ``max_len`` and ``prefill``."""

    state: State
    graphs: Graphs
    device: torch.device
    max_len: int
    host_pos: int  # the host's copy of state.pos: it launched every step, so it needs no synchronisation
    logits: torch.Tensor  # the last step's logits and choice (graph outputs: valid until the next replay)
    chosen: torch.Tensor

    def prefill(self, ids: torch.Tensor, sampling: Sampling, all_logits: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def _snapshot(self) -> list[torch.Tensor]:
        s = self.state
        return [t.clone() for t in (s.token, s.pos, s.tokens, s.presence, s.done)]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        s = self.state
        for tensor, value in zip((s.token, s.pos, s.tokens, s.presence, s.done), saved, strict=True):
            tensor.copy_(value)

    def _fits(self, ids: torch.Tensor) -> int:
        length = int(ids.numel())
        if length < 1 or length >= self.max_len:
            raise ValueError(f"prompt of {length} tokens does not fit a cache of {self.max_len}")
        return length

    def _start(self, ids: torch.Tensor) -> int:
        length = self._fits(ids)
        self.state.start(ids.to(self.device))
        return length

    def _first_choice(self, logits: torch.Tensor, sampling: Sampling, length: int) -> None:
        self.state.pos.fill_(length - 1)
        self.chosen = self.state.advance(logits[-1:], sampling)
        self.host_pos = length

    def prepare(self, *samplings: Sampling) -> None:
        """Compile and capture ahead of time (a failure falls back to eager steps, the reason recorded)."""
        for sampling in samplings:
            self.graphs.prepare(sampling)

    def step(self, sampling: Sampling) -> None:
        self.logits, self.chosen = self.graphs.run(sampling)
        self.host_pos += 1

    @torch.no_grad()
    def decode(self, steps: int, sampling: Sampling, stop_at_eos: bool = False) -> int:
        """Up to ``steps`` more tokens; returns how many steps ran."""
        steps = min(steps, self.max_len - 1 - self.host_pos)
        done = 0
        while done < steps:
            chunk = min(CHECK_EVERY if stop_at_eos else steps, steps - done)
            for _ in range(chunk):
                self.step(sampling)
            done += chunk
            if stop_at_eos and bool(self.state.done.item()):
                break
        return done

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, sampling: Sampling, stop_at_eos: bool) -> list[int]:
        """Prefill then decode: at most ``max_new_tokens`` new ids (through the first EOS when stopping)."""
        self.prefill(ids, sampling)
        if max_new_tokens > 1 and not (stop_at_eos and bool(self.state.done.item())):
            self.decode(max_new_tokens - 1, sampling, stop_at_eos)
        out = self.state.tokens[int(ids.numel()): self.host_pos + 1].tolist()[:max_new_tokens]
        if stop_at_eos:
            eos = set(self.state.eos.tolist())
            hits = [i for i, t in enumerate(out) if t in eos]
            out = out[: hits[0] + 1] if hits else out
        return out

    @torch.no_grad()
    def teacher(self, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (T, vocab) and greedy choices (T,) at every position of ``ids`` (1-D): the first ``split``
        through the prefill (the last of them as a prompt's next token is computed), the rest one decode step
        each, the input forced to the given token."""
        if ids.numel() >= self.max_len:
            raise ValueError(f"teacher forcing {ids.numel()} tokens needs a cache longer than {self.max_len}")
        greedy = Sampling.greedy()
        every = self.prefill(ids[:split], greedy, all_logits=True).cpu()
        # The prompt's last position as generation computes it (the last layer for that position alone).
        last = self.prefill(ids[:split], greedy).cpu()
        logits = [every[:-1], last]
        chosen = [every[:-1].argmax(-1), self.chosen.cpu()]
        for position in range(split, int(ids.numel())):
            self.state.token.fill_(int(ids[position]))
            self.state.pos.fill_(position)
            self.host_pos = position
            self.step(greedy)
            logits.append(self.logits.cpu())
            chosen.append(self.chosen.cpu())
        return torch.cat(logits), torch.cat(chosen)


class FastDecoder(Decoder):
    """Static-cache generation of one sequence (batch 1) over a loaded transformers Qwen2 model."""

    exact = False

    def __init__(self, model: Any, max_len: int, eos_ids: list[int], settings: GraphSettings) -> None:
        self.weights = qwen2.Weights.of(model, max_len)
        self.device = self.weights.lm_head.device
        self.cache = qwen2.KVCache(self.weights.dims, max_len, self.weights.lm_head.dtype, self.device)
        self.state = State.empty(max_len, self.weights.dims.vocab, eos_ids, self.device)
        self.max_len = max_len
        self.host_pos = 0
        self.step_fn = torch.compile(decode_one_token, fullgraph=True, dynamic=False, **settings.compile_kwargs()) \
            if settings.compile else decode_one_token
        # The prefill's layer, compiled once for every layer and prompt length: eager layers leave a long prefill
        # host-bound, one graph of all layers compiles far longer. The output head runs eagerly on what is kept.
        self.prefill_layer = torch.compile(qwen2.layer, fullgraph=True, dynamic=True) if settings.compile \
            else qwen2.layer
        self.compile_note = "compiled prefill" if settings.compile else "eager prefill"
        self.graphs = Graphs(settings, self.device, lambda s: [lambda: self._step_eager(s)], lambda i: None,
                             self._snapshot, self._restore, self._fallback, "one device graph per step")
        # A prompt's next token needs the last position alone; teacher forcing needs every position's logits.
        self.prefill_graphs = {last: LengthGraphs(partial(self._prefill_hidden, last_only=last), self.graphs.enabled)
                               for last in (True, False)}
        self.logits = torch.zeros(1, self.weights.dims.vocab, device=self.device)
        self.chosen = torch.zeros(1, dtype=torch.long, device=self.device)

    def _step_eager(self, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.step_fn(self.weights, self.cache, self.state.token, self.state.pos)
        return logits, self.state.advance(logits, sampling)

    def _fallback(self) -> None:
        self.step_fn = decode_one_token

    def prepare(self, *samplings: Sampling) -> None:
        start = time.perf_counter()
        try:
            if qwen2.triton_decode(self.device):
                from gpulab.kernels.triton.config import current_target

                qwen2.compile_decode_products(self.weights.dims, self.weights.embed.dtype, current_target())
                log.info("the decode products' configurations ready in %.1f s", time.perf_counter() - start)
        except Exception as exc:  # the step's first run compiles what is missing, one at a time
            log.warning("compiling the decode products ahead failed (%s: %s)", type(exc).__name__, exc)
        super().prepare(*samplings)

    @property
    def prefill_note(self) -> str:
        return f"{self.compile_note} ({self.prefill_graphs[True].mode})"

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, sampling: Sampling, all_logits: bool = False) -> torch.Tensor:
        """The prompt (1-D ids) through the model in one batch; fills the cache and chooses the next token."""
        length = self._fits(ids)
        ids = ids.to(self.device).view(1, -1)
        if length > 1:  # the sequence state's reset is in the prompt's graph, with the layers
            hidden = self.prefill_graphs[not all_logits](ids)
        else:  # one token: the decode kernels
            self.state.start(ids[0])
            hidden = qwen2.hidden(self.weights, self.cache, ids, torch.zeros(1, dtype=torch.long, device=self.device),
                                  qwen2.prefill_attention)
        logits = qwen2.logits(self.weights, hidden)  # the last position alone unless all_logits
        self._first_choice(logits, sampling, length)
        return logits

    def _prefill_hidden(self, ids: torch.Tensor, cut: Callable[[], None], last_only: bool) -> torch.Tensor:
        """The sequence state reset for prompt ``ids`` (1, T), then the compiled prefill, or eager layers with the
        reason where compiling fails; ``cut()`` after the first ``FIRST_GRAPH_LAYERS`` layers."""
        self.state.start(ids[0])
        args = (self.weights, self.cache, ids, torch.arange(ids.shape[-1], device=self.device),
                qwen2.prefill_attention)

        def after_layer(index: int) -> None:
            if index == FIRST_GRAPH_LAYERS - 1:
                cut()

        try:
            return qwen2.hidden(*args, run_layer=self.prefill_layer, last_only=last_only, after_layer=after_layer)
        except Exception as exc:  # an Inductor failure must not lose the measurement
            if self.prefill_layer is qwen2.layer:
                raise
            self.compile_note = f"eager prefill: compiling failed ({type(exc).__name__}: {str(exc)[:160]})"
            log.warning("%s", self.compile_note)
            self.prefill_layer = qwen2.layer
            return qwen2.hidden(*args, last_only=last_only, after_layer=after_layer)
