"""The engine registry: ``hf`` (transformers' ``generate``, the reference), ``fast``, ``fast_exact`` and
``hf_compiled``, behind one small protocol.

:data:`ENGINES` maps each name to its class, which carries the engine's summary, its correctness check and how it is
built, so the LLM step, the tuning sweep, the config and the report ask the registry. No PyTorch import here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gpulab.llm.study import Sampling

if TYPE_CHECKING:
    import torch

    from gpulab.core.device import DeviceInfo
    from gpulab.llm.checks import Check
    from gpulab.llm.graphs import GraphSettings
    from gpulab.llm.models import LoadedModel


class EngineSkipped(RuntimeError):
    """The engine cannot run here (its message says why): its rows are skipped, not failed."""


class Engine(Protocol):
    name: str
    summary: str
    detail: str
    graph_mode: str

    @classmethod
    def create(cls, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any], study: Sampling,
               eos_ids: list[int]) -> Engine: ...

    @staticmethod
    def check_tests(check_tokens: int, teacher_tokens: int) -> list[str]: ...

    @staticmethod
    def compile_ahead(config: Any, dtype: str, info: DeviceInfo) -> None: ...

    def check(self, hf: HfEngine, prompts: Mapping[str, Any], cfg: Mapping[str, Any], check_tokens: int,
              texts: dict[str, Any]) -> Check | None: ...

    @property
    def decode_cache_len(self) -> int | None: ...

    @property
    def kv_cache_bytes(self) -> int | None: ...

    def prefill(self, ids: torch.Tensor) -> None: ...

    def first_token(self, ids: torch.Tensor) -> int: ...

    def generate(self, ids: torch.Tensor, n: int, sampling: Sampling, stop_at_eos: bool) -> list[int]: ...

    def decode_run(self, ids: torch.Tensor, n: int) -> Callable[[], Any]: ...


def _no_grad(method: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.no_grad()`` around a method, PyTorch imported at the call."""
    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return method(*args, **kwargs)

    return wrapped


class HfEngine:
    """transformers' ``generate``, called as the study calls it (the baseline)."""

    name: ClassVar[str] = "hf"
    summary: ClassVar[str] = "transformers' generate as the study calls it (the baseline and reference)"
    graph_mode = "none (eager PyTorch)"

    def __init__(self, loaded: LoadedModel) -> None:
        self.model, self.tokenizer = loaded.model, loaded.tokenizer

    @property
    def detail(self) -> str:
        import transformers

        return f"transformers {transformers.__version__} generate, dynamic cache, eager PyTorch"

    @classmethod
    def create(cls, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any], study: Sampling,
               eos_ids: list[int]) -> HfEngine:
        return cls(loaded)

    @staticmethod
    def check_tests(check_tokens: int, teacher_tokens: int) -> list[str]:
        """The correctness check's test names (none: it is the reference)."""
        return []

    @staticmethod
    def compile_ahead(config: Any, dtype: str, info: DeviceInfo) -> None:
        """What the engine can compile for the probed device from the model's config alone, launching nothing,
        before its job claims the device (nothing here: eager PyTorch)."""

    def check(self, hf: HfEngine, prompts: Mapping[str, Any], cfg: Mapping[str, Any], check_tokens: int,
              texts: dict[str, Any]) -> Check | None:
        return None

    @property
    def decode_cache_len(self) -> int | None:
        """Its decode attention's fixed cache length (None: transformers' attention over the tokens so far)."""
        return None

    @property
    def kv_cache_bytes(self) -> int | None:
        """Bytes of its static KV cache (None: transformers' dynamic cache grows with the sequence)."""
        return None

    @_no_grad
    def prefill(self, ids: torch.Tensor) -> None:
        self.model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def first_token(self, ids: torch.Tensor) -> int:
        return self.generate(ids, 1, Sampling.greedy(), stop_at_eos=False)[0]

    @_no_grad
    def generate(self, ids: torch.Tensor, n: int, sampling: Sampling, stop_at_eos: bool) -> list[int]:
        import torch

        if stop_at_eos:  # the study's call, argument for argument (no attention mask, pad = eos), merged
            # over the model's generation config exactly as the study's was
            out = self._generate(ids, max_new_tokens=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                 pad_token_id=self.tokenizer.eos_token_id)
        else:
            out = self._generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 pad_token_id=self.tokenizer.pad_token_id, **sampling.generate_kwargs())
        return out[0, ids.shape[1]:].tolist()

    def _generate(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.model.generate(ids, **kwargs)

    def decode_run(self, ids: torch.Tensor, n: int) -> Callable[[], Any]:
        """``n`` greedy tokens after a one-token prompt: ``n`` one-token forward passes (the prefill is one)."""
        return lambda: self.generate(ids, n, Sampling.greedy(), stop_at_eos=False)

    @_no_grad
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
        import torch

        return torch.cat(logits)


class FastEngine:
    """A static-cache decoder over the loaded weights (gpt-fast's design, :mod:`gpulab.llm.fast`), compiled and
    captured up front for greedy decoding and for the study's sampling; checked by teacher forcing."""

    name: ClassVar[str] = "fast"
    summary: ClassVar[str] = ("one device graph per decode step (static KV cache, fused products, Triton decode "
                              "attention), rounding checked by teacher forcing against transformers")

    def __init__(self, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any], study: Sampling,
                 eos_ids: list[int], settings: GraphSettings | None = None) -> None:
        import torch

        from gpulab.llm.graphs import GraphSettings

        gpu = loaded.model.lm_head.weight.device.type == "cuda"
        # ``settings``: a tuning variant's (gpulab.llm.tune); by default the config's.
        self.settings = settings or GraphSettings.resolve(dict(cfg), gpu)
        self.decoder: Any = self._decoder(loaded, max_len, eos_ids, cfg)
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

    def _decoder(self, loaded: LoadedModel, max_len: int, eos_ids: list[int], cfg: Mapping[str, Any]) -> Any:
        from gpulab.llm.fast import FastDecoder

        return FastDecoder(loaded.model, max_len, eos_ids, self.settings)

    @classmethod
    def create(cls, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any], study: Sampling,
               eos_ids: list[int]) -> FastEngine:
        return cls(loaded, max_len, cfg, study, eos_ids)

    @staticmethod
    def compile_ahead(config: Any, dtype: str, info: DeviceInfo) -> None:
        """The decode step's fused products, every configuration they autotune over
        (:func:`gpulab.llm.qwen2.compile_decode_products`), where the step runs them: a GPU with Triton."""
        import importlib.util

        if not info.gpu_available or importlib.util.find_spec("triton") is None:
            return
        from gpulab.core.dtypes import torch_dtype
        from gpulab.kernels.triton.config import target_of
        from gpulab.llm import qwen2

        qwen2.compile_decode_products(qwen2.Dims.of(config), torch_dtype(dtype), target_of(info))

    @staticmethod
    def check_tests(check_tokens: int, teacher_tokens: int) -> list[str]:
        return [f"teacher{teacher_tokens}"]

    def check(self, hf: HfEngine, prompts: Mapping[str, Any], cfg: Mapping[str, Any], check_tokens: int,
              texts: dict[str, Any]) -> Check | None:
        """Teacher forcing of the seeded random sequence against transformers (:mod:`gpulab.llm.checks`)."""
        from gpulab.llm import checks

        return checks.teacher_forcing(self, hf, prompts["teacher"], float(cfg["teacher_tolerance"]))

    def teacher(self, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and greedy choices of every position of ``ids`` (1-D) under teacher forcing."""
        return self.decoder.teacher(ids, split)

    @property
    def decode_cache_len(self) -> int | None:
        return int(self.decoder.max_len)

    @property
    def kv_cache_bytes(self) -> int | None:
        return int(self.decoder.cache.nbytes)

    @property
    def graph_mode(self) -> str:
        return self.decoder.graphs.mode

    @property
    def detail(self) -> str:
        compiled = "torch.compile decode step" if self.settings.compile else "eager decode step"
        numerics = "bit-exact numerics (transformers' kernels; cuDNN SDPA off)"
        if not self.decoder.exact:
            from gpulab.llm.qwen2 import split_kv_available

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


class ExactEngine(FastEngine):
    """The verifier: bit-identical to transformers (its kernels, its attention between per-layer graphs,
    :mod:`gpulab.llm.exact`); checked by greedy-token identity."""

    name: ClassVar[str] = "fast_exact"
    summary: ClassVar[str] = "bit-identical to transformers, per-layer graphs, checked by greedy-token identity"

    def _decoder(self, loaded: LoadedModel, max_len: int, eos_ids: list[int], cfg: Mapping[str, Any]) -> Any:
        from gpulab.llm.exact import ExactDecoder

        return ExactDecoder(loaded.model, max_len, eos_ids, self.settings, str(cfg["fast_streams"]))

    @staticmethod
    def check_tests(check_tokens: int, teacher_tokens: int) -> list[str]:
        return [f"greedy{check_tokens}"]

    @staticmethod
    def compile_ahead(config: Any, dtype: str, info: DeviceInfo) -> None:
        """Nothing: transformers' own kernels."""

    def check(self, hf: HfEngine, prompts: Mapping[str, Any], cfg: Mapping[str, Any], check_tokens: int,
              texts: dict[str, Any]) -> Check | None:
        """Its first greedy tokens of the study's prompt against generate's (:mod:`gpulab.llm.checks`)."""
        from gpulab.llm import checks

        check, texts["greedy"] = checks.greedy_identity(self, hf, prompts["chat"], check_tokens)
        return check

    @property
    def decode_cache_len(self) -> int | None:
        return None


class HfCompiledEngine(HfEngine):
    """The fast path transformers' documentation recommends: ``generate`` over a static KV cache, the decode step
    compiled by transformers (:mod:`gpulab.llm.hf_compiled`); checked by teacher forcing."""

    name: ClassVar[str] = "hf_compiled"
    summary: ClassVar[str] = ("transformers' generate over a static KV cache, its decode step compiled by "
                              "torch.compile (mode reduce-overhead: CUDA graphs), rounding checked by teacher forcing")
    # Decode tokens of the warm-up call: the compiled step runs once eagerly, is recorded, then replays.
    WARMUP_TOKENS: ClassVar[int] = 8

    def __init__(self, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any]) -> None:
        super().__init__(loaded)
        from gpulab.llm.graphs import GraphSettings
        from gpulab.llm.hf_compiled import StaticGenerate

        gpu = loaded.model.lm_head.weight.device.type == "cuda"
        if cfg["compile"] == "auto" and not gpu:
            raise EngineSkipped("no GPU: transformers compiles the decode step on an accelerator (llm.compile auto; "
                                "true compiles it on the CPU, false runs it eagerly)")
        self.settings = GraphSettings.resolve(dict(cfg), gpu)
        self.no_graphs_why = "llm.graphs off" if cfg["graphs"] == "off" else "no GPU"
        self.static = StaticGenerate(loaded.model, max_len, self.settings.compile, self.settings.graphs,
                                     self.tokenizer.pad_token_id)
        self.graphs_compiled, self.cudagraph_skips, self.prepare_s = self._warm_up()

    @classmethod
    def create(cls, loaded: LoadedModel, max_len: int, cfg: Mapping[str, Any], study: Sampling,
               eos_ids: list[int]) -> HfCompiledEngine:
        return cls(loaded, max_len, cfg)

    def _warm_up(self) -> tuple[int, int, float]:
        """Compile and record the decode step before any time is taken: the graphs dynamo compiled, the times
        inductor skipped CUDA graphs, the seconds it took. A failure names the compiled step."""
        import torch
        from torch._dynamo.utils import counters

        graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
        start = time.perf_counter()
        if self.static.compiled:
            ids = torch.zeros((1, 1), dtype=torch.long, device=self.model.lm_head.weight.device)
            try:
                self.generate(ids, self.WARMUP_TOKENS, Sampling.greedy(), stop_at_eos=False)
                if ids.device.type == "cuda":
                    torch.cuda.synchronize()
            except Exception as exc:
                text = str(exc).strip().splitlines()
                raise RuntimeError(f"transformers' compiled decode step failed in its warm-up ({type(exc).__name__}: "
                                   f"{text[0] if text else ''})") from exc
        return (counters["stats"]["unique_graphs"] - graphs, counters["inductor"]["cudagraph_skips"] - skips,
                time.perf_counter() - start)

    @staticmethod
    def check_tests(check_tokens: int, teacher_tokens: int) -> list[str]:
        return [f"teacher{teacher_tokens}"]

    def check(self, hf: HfEngine, prompts: Mapping[str, Any], cfg: Mapping[str, Any], check_tokens: int,
              texts: dict[str, Any]) -> Check | None:
        """Teacher forcing of the seeded random sequence against transformers' eager run (:mod:`gpulab.llm.checks`):
        the compiled step rounds differently from the eager one."""
        from gpulab.llm import checks

        return checks.teacher_forcing(self, hf, prompts["teacher"], float(cfg["teacher_tolerance"]))

    def teacher(self, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and greedy choices from the prompt's last position on, through ``generate`` itself."""
        return self.static.teacher(ids, split)

    @property
    def kv_cache_bytes(self) -> int | None:
        return self.static.nbytes

    @property
    def graph_mode(self) -> str:
        mode = self.static.compile_config.mode
        if not self.static.compiled:
            return "none (eager PyTorch)"
        if mode != "reduce-overhead":
            return f"none (torch.compile mode {mode}: {self.no_graphs_why})"
        if self.cudagraph_skips:
            return (f"off: inductor skipped CUDA graphs {self.cudagraph_skips} time(s) in the warm-up "
                    "(torch.compile mode reduce-overhead; the log says why)")
        return "CUDA graph trees of the compiled decode step (torch.compile mode reduce-overhead)"

    @property
    def detail(self) -> str:
        import transformers

        config = self.static.compile_config
        if self.static.compiled:
            step = (f"decode step compiled by transformers (torch.compile mode {config.mode}, fullgraph "
                    f"{config.fullgraph}, dynamic {config.dynamic}), {self.graphs_compiled} graph(s) compiled in the "
                    f"warm-up of {self.prepare_s:.1f} s")
        else:
            step = "eager decode step (llm.compile off)"
        return (f"transformers {transformers.__version__} generate, static KV cache of {self.static.max_len} "
                f"positions, eager prefill, {step}")

    def prefill(self, ids: torch.Tensor) -> None:
        self.static.prefill(ids)

    def _generate(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.static.generate(ids, **kwargs)


# The engine registry: name -> class (its properties are class attributes); the config's llm.engines.
ENGINES: dict[str, type[HfEngine] | type[FastEngine]] = {
    cls.name: cls for cls in (HfEngine, FastEngine, ExactEngine, HfCompiledEngine)}


def engine_class(name: str) -> type[HfEngine] | type[FastEngine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}") from None


def engines_described(names: Sequence[str] | None = None) -> str:
    """``name: summary`` of each engine, for the tables' column descriptions."""
    return " | ".join(f"{name}: {ENGINES[name].summary}" for name in (names or ENGINES))
