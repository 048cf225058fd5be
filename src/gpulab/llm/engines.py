"""The engines behind one small protocol: ``hf`` (transformers' ``generate``, the study's call and the
reference), ``fast`` (:mod:`gpulab.llm.fast`) and ``fast_exact`` (:mod:`gpulab.llm.exact`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from gpulab.llm.graphs import GraphSettings
from gpulab.llm.models import LoadedModel
from gpulab.llm.qwen2 import split_kv_available
from gpulab.llm.study import Sampling

ENGINES = ("hf", "fast", "fast_exact")


class Engine(Protocol):
    name: str
    detail: str
    graph_mode: str

    def prefill(self, ids: torch.Tensor) -> None: ...

    def first_token(self, ids: torch.Tensor) -> int: ...

    def generate(self, ids: torch.Tensor, n: int, sampling: Sampling, stop_at_eos: bool) -> list[int]: ...

    def decode_run(self, ids: torch.Tensor, n: int) -> Callable[[], Any]: ...


class HfEngine:
    """transformers' ``generate``, called as the study calls it (the baseline)."""

    name = "hf"
    graph_mode = "none (eager PyTorch)"

    def __init__(self, loaded: LoadedModel) -> None:
        import transformers

        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.detail = f"transformers {transformers.__version__} generate, dynamic cache, eager PyTorch"

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> None:
        self.model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def first_token(self, ids: torch.Tensor) -> int:
        return self.generate(ids, 1, Sampling.greedy(), stop_at_eos=False)[0]

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, n: int, sampling: Sampling, stop_at_eos: bool) -> list[int]:
        if stop_at_eos:  # the study's call, argument for argument (no attention mask, pad = eos), merged
            # over the model's generation config exactly as the study's was
            out = self.model.generate(ids, max_new_tokens=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                      pad_token_id=self.tokenizer.eos_token_id)
        else:
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      pad_token_id=self.tokenizer.pad_token_id, **sampling.generate_kwargs())
        return out[0, ids.shape[1]:].tolist()

    def decode_run(self, ids: torch.Tensor, n: int) -> Callable[[], Any]:
        """``n`` greedy tokens after a one-token prompt: ``n`` one-token forward passes (the prefill is one)."""
        return lambda: self.generate(ids, n, Sampling.greedy(), stop_at_eos=False)

    @torch.no_grad()
    def logits(self, ids: torch.Tensor, split: int | None = None) -> torch.Tensor:
        """float32 logits at every position of ``ids`` (1-D): one forward pass, or (the teacher-forcing
        reference) the first ``split`` positions as a prefill and then one step per token with its cache,
        the way the fast engines run the sequence, so both sides round as a prefill and as decode steps."""
        split = int(ids.numel()) if split is None else split
        out = self.model(input_ids=ids[:split].view(1, -1), use_cache=True)
        logits, cache = [out.logits[0].float()], out.past_key_values
        for position in range(split, int(ids.numel())):
            out = self.model(input_ids=ids[position:position + 1].view(1, 1), past_key_values=cache, use_cache=True)
            logits.append(out.logits[0].float())
            cache = out.past_key_values
        return torch.cat(logits)


class FastEngine:
    """A static-cache decoder (``fast`` or ``fast_exact``) over the loaded weights, compiled and captured up
    front for greedy decoding and for the study's sampling."""

    def __init__(self, name: str, loaded: LoadedModel, max_len: int, cfg: dict[str, Any], study: Sampling,
                 eos_ids: list[int], settings: GraphSettings | None = None) -> None:
        from gpulab.llm.exact import ExactDecoder
        from gpulab.llm.fast import FastDecoder

        gpu = loaded.model.lm_head.weight.device.type == "cuda"
        # ``settings``: a tuning variant's (gpulab.llm.tune); by default the config's.
        self.name, self.settings = name, settings or GraphSettings.resolve(cfg, gpu)
        if name == "fast_exact":
            self.decoder: Any = ExactDecoder(loaded.model, max_len, eos_ids, self.settings, str(cfg["fast_streams"]))
        else:
            self.decoder = FastDecoder(loaded.model, max_len, eos_ids, self.settings)
        start = time.perf_counter()
        self.decoder.prepare(Sampling.greedy(), study)
        if gpu:
            # a one-token prompt's prefill runs the decode kernels eagerly, a longer one the compiled prefill:
            # their compiling and autotuning happen here too
            for length in (1, 16):
                self.decoder.prefill(torch.zeros(length, dtype=torch.long), Sampling.greedy())
            torch.cuda.synchronize()
            # what compiling and autotuning left cached (Triton's 256 MB timing buffer among it) is not the engine's
            torch.cuda.empty_cache()
        self.prepare_s = time.perf_counter() - start

    @property
    def graph_mode(self) -> str:
        return self.decoder.graphs.mode

    @property
    def detail(self) -> str:
        compiled = "torch.compile decode step" if self.settings.compile else "eager decode step"
        numerics = "bit-exact numerics (transformers' kernels; cuDNN SDPA off)"
        if not self.decoder.exact:
            split_kv = split_kv_available(self.decoder.device, self.decoder.weights.dims.head_dim)
            numerics = "fused Q/K/V and gate/up products, " + \
                ("Triton split-KV decode attention and fused matrix-vector products" if split_kv
                 else "masked fixed-length SDPA decode attention")
        prefill = getattr(self.decoder, "prefill_note", "transformers' prefill")
        return (f"static KV cache, batched {prefill}, {compiled}, {self.graph_mode}, {numerics}; "
                f"compile+capture {self.prepare_s:.1f} s")

    def prefill(self, ids: torch.Tensor) -> None:
        self.decoder.prefill(ids[0], Sampling.greedy())

    def first_token(self, ids: torch.Tensor) -> int:
        self.decoder.prefill(ids[0], Sampling.greedy())
        return int(self.decoder.chosen.item())

    def generate(self, ids: torch.Tensor, n: int, sampling: Sampling, stop_at_eos: bool) -> list[int]:
        return self.decoder.generate(ids[0], n, sampling, stop_at_eos)

    def decode_run(self, ids: torch.Tensor, n: int) -> Callable[[], Any]:
        """``n`` greedy decode steps (graph replays) after the prompt's prefill, which runs now."""
        self.decoder.prefill(ids[0], Sampling.greedy())
        return lambda: self.decoder.decode(n, Sampling.greedy())
