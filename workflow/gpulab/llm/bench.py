"""Rule ``llm_infer``: the study's run and llama-bench-style figures of one model through one or more engines.

Per engine, in this order (the correctness check first, so no time is trusted before it):

- ``greedy<N>`` (engine fast only): the first N greedy tokens of the study's prompt must equal
  transformers' ``generate`` token for token;
- ``pp<N>``: prefill of N prompt tokens (random ids, as llama-bench uses), tokens/s;
- ``ttft<N>``: time to first token for that prompt, the token on the host;
- ``tg<N>``: N generated tokens after a one-token prompt, generation forced to its length, tokens/s;
- ``study``: the study's prompt and call (sampling, 512 new tokens at most, stopping at end of sequence),
  tokens/s as the study computes it, peak memory, the response saved.

Every time goes through :func:`gpulab.timing.measure` (first call untimed and reported, ``llm.reps``
timed repetitions, mean ± sd); peak memory is the device allocator's high-water mark of that test.
Achieved bandwidth is weight bytes × tokens/s, placed against the measured copy bandwidth.

Run as ``python -m gpulab.llm.bench --model tiny --engine hf --engine fast --out DIR`` where no Snakemake
is installed (e.g. a bare GPU box).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.ceilings import pct_of
from gpulab.llm import study as study_mod
from gpulab.llm.models import LoadedModel, ResolvedModel, load_model, model_slug
from gpulab.llm.study import MESSAGES, Sampling
from gpulab.tables import Column, TableSchema, write_atomic
from gpulab.timing import Timing, TimingSettings, measure

log = logging.getLogger(__name__)

ENGINES = ("hf", "fast")
STUDY_WARMUP_TOKENS = 8
CPU_MAX_WEIGHT_BYTES = 4 * 2**30  # bigger models are skipped on CPU: the study's 512 tokens would take hours
AOTRITON_VARIABLE = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"

LLM = TableSchema(
    "llm",
    (
        Column("model", "str", "the spec as configured: tiny, random:<id>, a modelscope id or a directory"),
        Column("model_source", "str", "real | random | tiny: whose weights the row measured"),
        Column("engine", "str", "hf: transformers generate | fast: static cache, compiled decode, device graphs"),
        Column("test", "str", "study | pp<N> | ttft<N> | tg<N> | greedy<N> (llama-bench's names)"),
        Column("engine_detail", "str", "how the engine ran (versions, compilation, graphs, numerics)"),
        Column("dtype", "str", "weight and activation dtype"),
        Column("device", "str", "the device the row ran on"),
        Column("attn_impl", "str", "transformers' attention implementation of the loaded model"),
        Column("sdpa_kernel", "str", "kernel scaled_dot_product_attention dispatched to (prefill / decode)"),
        Column("aotriton_experimental", "str", f"{AOTRITON_VARIABLE} as set for the run (read on ROCm only)"),
        Column("n_prompt", "int", "prompt tokens"),
        Column("n_gen", "int", "generated tokens per run (the study: up to and including end of sequence)"),
        Column("tok_s", "float", "tokens/s: prompt tokens (pp) or generated tokens (tg, study) over the mean time"),
        Column("tok_s_sd", "float", "standard deviation of tok_s over the repetitions (tok_s x cv)"),
        Column("peak_alloc_gib", "float", "peak allocated memory during the test, GiB (process RSS peak on CPU)"),
        Column("peak_reserved_gib", "float", "peak memory held by the caching allocator, GiB (RSS peak on CPU)"),
        Column("mem_counter", "str", "what the memory columns read"),
        Column("weight_bytes", "int", "bytes of all parameters"),
        Column("gbps", "float", "achieved GB/s: weight bytes x tokens/s (decode rows)"),
        Column("copy_gbps", "float", "measured device copy bandwidth, GB/s (bench/ceilings.csv)"),
        Column("roofline_tok_s", "float", "tokens/s if every token read all weights at copy bandwidth"),
        Column("pct_of_copy_bw", "float", "gbps as % of copy_gbps"),
        Column("load_s", "float", "model load time, s (tokenizer excluded, as the study timed it)"),
        Column("tokens_match", "bool", "greedy rows: fast's tokens equal transformers' generate"),
        Column("first_mismatch", "int", "greedy rows: index of the first differing token"),
        Column("text_file", "str", "JSON beside the CSV with the prompts, responses and token ids"),
        Column("seed", "int", "seed of random weights, prompts and sampling"),
    ),
    measured=True,
)


def llm_defaults() -> dict[str, Any]:
    """The ``llm`` section's defaults from the config schema (usable without jsonschema)."""
    from gpulab.config import load_schema

    props = load_schema()["properties"]["llm"]["properties"]
    return {key: spec["default"] for key, spec in props.items() if "default" in spec}


def apply_aotriton_env(enabled: bool, environ: dict[str, str] | None = None) -> str:
    """Set the variable from config before torch starts (the study sets it to 1); return the value."""
    environ = os.environ if environ is None else environ
    environ[AOTRITON_VARIABLE] = "1" if enabled else "0"
    return environ[AOTRITON_VARIABLE]


@dataclass(frozen=True)
class Sizes:
    prompt_tokens: int
    gen_tokens: int
    max_new_tokens: int
    check_tokens: int
    reps: int

    @classmethod
    def resolve(cls, cfg: Mapping[str, Any], gpu: bool) -> Sizes:
        def pick(key: str, gpu_value: int, cpu_value: int) -> int:
            value = cfg.get(key, "auto")
            return (gpu_value if gpu else cpu_value) if value == "auto" else int(value)

        return cls(pick("prompt_tokens", 512, 128), pick("gen_tokens", 128, 32), pick("max_new_tokens", 512, 128),
                   int(cfg["check_tokens"]), int(cfg["reps"]))


class PeakMemory:
    """High-water marks of one test: the CUDA/HIP caching allocator, or the process RSS on CPU."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.counter = ("torch.cuda.max_memory_allocated / max_memory_reserved" if gpu
                        else "process peak RSS (VmHWM, reset per test)")

    def reset(self) -> None:
        import torch

        if self.gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets the peak RSS of this process
        except OSError:
            self.counter = "process peak RSS since start (VmHWM could not be reset)"

    def read(self) -> tuple[float, float]:
        import torch

        if self.gpu:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024 / 2**30
                    return peak, peak
        except OSError:
            pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        return peak, peak


def sdpa_kernel(q_shape: Sequence[int], kv_shape: Sequence[int], causal: bool, device: str, dtype: Any) -> str:
    """Which kernel ``scaled_dot_product_attention`` picks for these shapes, read off the profiler's op names."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    names = {
        "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
        "aten::_scaled_dot_product_flash_attention": "flash",
        "aten::_scaled_dot_product_efficient_attention": "efficient",
        "aten::_scaled_dot_product_cudnn_attention": "cudnn",
        "aten::_scaled_dot_product_attention_math": "math",
    }
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(*q_shape, device=device, dtype=dtype, generator=gen)
    k = torch.randn(*kv_shape, device=device, dtype=dtype, generator=gen)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            F.scaled_dot_product_attention(q, k, k, is_causal=causal, enable_gqa=q_shape[1] != kv_shape[1])
    except Exception as exc:  # a probe failure is a recorded answer, not a crash
        return f"unknown ({type(exc).__name__})"
    seen = {e.name for e in prof.events()}
    found = [label for op, label in names.items() if op in seen]
    return found[0] if found else "other"


# -- engines ---------------------------------------------------------------------------------------------


class HfEngine:
    """transformers' ``generate``, called as the study calls it (the baseline)."""

    name = "hf"

    def __init__(self, loaded: LoadedModel) -> None:
        import transformers

        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.detail = f"transformers {transformers.__version__} generate, dynamic cache, eager PyTorch"

    def _generate(self, ids: Any, n: int, sampling: Sampling) -> Any:
        import torch

        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      pad_token_id=self.tokenizer.pad_token_id, **sampling.generate_kwargs())
        return out[0, ids.shape[1]:]

    def greedy(self, ids: Any, n: int) -> list[int]:
        return self._generate(ids, n, Sampling.greedy()).tolist()

    def prefill(self, ids: Any) -> None:
        import torch

        with torch.no_grad():
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def first_token(self, ids: Any) -> int:
        return int(self._generate(ids, 1, Sampling.greedy())[0].item())

    def tg(self, ids: Any, n: int) -> None:
        self._generate(ids, n, Sampling.greedy())

    def study(self, ids: Any, max_new_tokens: int, temperature: float, top_p: float) -> list[int]:
        import torch

        # The study's call, argument for argument (no attention mask, pad = eos).
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                      pad_token_id=self.tokenizer.eos_token_id)
        return out[0, ids.shape[1]:].tolist()


class FastEngine:
    """:class:`gpulab.llm.fast.FastQwen2` over the same loaded weights."""

    name = "fast"

    def __init__(self, loaded: LoadedModel, max_len: int, compile_: bool, exact: bool, streams: str,
                 study: Sampling, eos_ids: list[int]) -> None:
        import torch

        from gpulab.llm.fast import FastOptions, FastQwen2

        gpu = loaded.model.lm_head.weight.device.type == "cuda"
        options = FastOptions(compile=compile_, graphs=gpu, exact=exact, parallel=streams != "none",
                              parallel_mlp=streams == "qkv_mlp")
        self.impl = FastQwen2(loaded.model, max_len, options, eos_ids)
        self.study_sampling = study
        start = time.perf_counter()
        self.impl.prepare(Sampling.greedy(), study)
        if gpu:
            torch.cuda.synchronize()
        self.prepare_s = time.perf_counter() - start

    @property
    def detail(self) -> str:
        text = f"{self.impl.options.describe()}; compile+capture {self.prepare_s:.1f} s"
        if self.impl.compile_error:
            text += f"; torch.compile failed ({self.impl.compile_error}), ran eagerly"
        return text

    def greedy(self, ids: Any, n: int) -> list[int]:
        return self.impl.generate(ids[0], n, Sampling.greedy(), stop_at_eos=False).tolist()

    def prefill(self, ids: Any) -> None:
        self.impl.prefill(ids[0], Sampling.greedy())

    def first_token(self, ids: Any) -> int:
        self.impl.prefill(ids[0], Sampling.greedy())
        return int(self.impl.tokens[ids.shape[1]].item())

    def tg(self, ids: Any, n: int) -> None:
        self.impl.prefill(ids[0], Sampling.greedy())
        self.impl.decode(n - 1, Sampling.greedy())

    def study(self, ids: Any, max_new_tokens: int, temperature: float, top_p: float) -> list[int]:
        return self.impl.generate(ids[0], max_new_tokens, self.study_sampling, stop_at_eos=True).tolist()


class _StudyRun:
    """The study's generation as a closure for :func:`measure`: its untimed first call is a short warm-up
    (the same prompt and sampling, a few tokens), the timed call the full run, whose output is kept."""

    def __init__(self, engine: Any, ids: Any, max_new_tokens: int, temperature: float, top_p: float) -> None:
        self.engine, self.ids, self.max_new_tokens = engine, ids, max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.calls = 0
        self.output: list[int] = []

    def __call__(self) -> None:
        n = min(STUDY_WARMUP_TOKENS, self.max_new_tokens) if self.calls == 0 else self.max_new_tokens
        self.calls += 1
        self.output = self.engine.study(self.ids, n, self.temperature, self.top_p)


# -- the measurements ------------------------------------------------------------------------------------


def _mean_sd_tok_s(tokens: int, timing: Timing) -> tuple[float, float]:
    tok_s = tokens / (timing.mean_ms / 1e3)
    return tok_s, tok_s * timing.cv if not math.isnan(timing.cv) else math.nan


def _error_status(exc: BaseException) -> str:
    import torch

    return "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower() else "failed"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def run_engine(engine: Any, loaded: LoadedModel, cfg: Mapping[str, Any], sizes: Sizes, *, base: Mapping[str, Any],
               reference_greedy: list[int] | None, copy_gbps: float, device: str, gpu: bool) -> tuple[list[dict], dict]:
    """All rows of one engine, and the texts for its JSON file."""
    import torch

    seed = int(cfg["seed"])
    tokenizer, model = loaded.tokenizer, loaded.model
    memory = PeakMemory(gpu)
    settings = TimingSettings(min_time_s=1e-9, min_reps=sizes.reps, max_reps=sizes.reps, warmup_reps=1,
                              flush_cache=False)
    once = TimingSettings(min_time_s=1e-9, min_reps=1, max_reps=1, warmup_reps=1, flush_cache=False)
    from gpulab.device import detect

    info = detect()
    chat = tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
    chat_ids = tokenizer([chat], return_tensors="pt").input_ids.to(device)
    high = min(int(tokenizer.vocab_size), int(model.config.vocab_size))
    generator = torch.Generator().manual_seed(seed)
    pp_ids = torch.randint(0, high, (1, sizes.prompt_tokens), generator=generator).to(device)
    tg_ids = pp_ids[:, :1]
    rows: list[dict[str, Any]] = []
    texts: dict[str, Any] = {"engine": engine.name, "detail": engine.detail}
    roofline = copy_gbps * 1e9 / loaded.weight_bytes if copy_gbps and not math.isnan(copy_gbps) else math.nan

    def row(test: str, **values: Any) -> dict[str, Any]:
        out = {**base, "engine": engine.name, "engine_detail": engine.detail, "test": test, "status": "ok",
               "reason": "", "copy_gbps": copy_gbps, "roofline_tok_s": roofline, "mem_counter": memory.counter}
        out.update(values)
        return out

    def timed(test: str, fn: Any, tokens: int, n_prompt: int, n_gen: int, decode: bool,
              timing_settings: TimingSettings = settings) -> None:
        try:
            memory.reset()
            timing = measure(fn, timing_settings, info)
            alloc, reserved = memory.read()
        except Exception as exc:  # one failing test is a recorded outcome; the others still run
            log.error("%s %s failed:\n%s", engine.name, test, traceback.format_exc())
            rows.append(row(test, status=_error_status(exc), reason=_first_line(exc), n_prompt=n_prompt, n_gen=n_gen))
            return
        values: dict[str, Any] = {"n_prompt": n_prompt, "n_gen": n_gen, "peak_alloc_gib": alloc,
                                  "peak_reserved_gib": reserved, **timing.as_row()}
        if tokens:
            values["tok_s"], values["tok_s_sd"] = _mean_sd_tok_s(tokens, timing)
        if decode:
            values["gbps"] = loaded.weight_bytes * values["tok_s"] / 1e9
            values["pct_of_copy_bw"] = pct_of(values["gbps"], copy_gbps)
        rows.append(row(test, **values))
        log.info("%s %s: %s", engine.name, test, {k: values.get(k) for k in ("tok_s", "tok_s_sd", "mean_ms",
                                                                            "peak_alloc_gib", "pct_of_copy_bw")})

    # Correctness first: fast's greedy tokens against transformers' generate on the study's prompt.
    greedy = engine.greedy(chat_ids, sizes.check_tokens)
    texts["greedy"] = {"prompt_tokens": int(chat_ids.shape[1]), "tokens": greedy,
                       "text": tokenizer.decode(greedy, skip_special_tokens=False)}
    mismatch = ""
    if reference_greedy is not None:
        differ = [i for i, (a, b) in enumerate(zip(greedy, reference_greedy, strict=True)) if a != b]
        match = not differ
        first = differ[0] if differ else None
        if differ:
            mismatch = (f"greedy tokens differ from hf at token {first} (fast {greedy[first]} vs hf "
                        f"{reference_greedy[first]}; {_reference_margin(model, chat_ids, reference_greedy[:first])}); "
                        "times not trusted")
        rows.append(row(f"greedy{sizes.check_tokens}", status="ok" if match else "incorrect", reason=mismatch,
                        n_prompt=int(chat_ids.shape[1]), n_gen=sizes.check_tokens, tokens_match=match,
                        first_mismatch=first))
        texts["greedy"]["hf_tokens"] = reference_greedy

    timed(f"pp{sizes.prompt_tokens}", lambda: engine.prefill(pp_ids), sizes.prompt_tokens, sizes.prompt_tokens, 0,
          decode=False)
    timed(f"ttft{sizes.prompt_tokens}", lambda: engine.first_token(pp_ids), 0, sizes.prompt_tokens, 1, decode=False)
    timed(f"tg{sizes.gen_tokens}", lambda: engine.tg(tg_ids, sizes.gen_tokens), sizes.gen_tokens, 1,
          sizes.gen_tokens, decode=True)

    torch.manual_seed(seed)
    run = _StudyRun(engine, chat_ids, sizes.max_new_tokens, float(cfg["temperature"]), float(cfg["top_p"]))
    before = len(rows)
    timed("study", run, 0, int(chat_ids.shape[1]), 0, decode=False, timing_settings=once)
    if len(rows) > before and rows[-1]["status"] == "ok":
        study_row = rows[-1]
        n_gen = len(run.output)
        study_row["n_gen"] = n_gen
        study_row["tok_s"] = n_gen / (study_row["mean_ms"] / 1e3)
        study_row["tok_s_sd"] = math.nan  # one run, as the study did
        study_row["gbps"] = loaded.weight_bytes * study_row["tok_s"] / 1e9
        study_row["pct_of_copy_bw"] = pct_of(study_row["gbps"], copy_gbps)
    texts["study"] = {
        "messages": list(MESSAGES), "prompt_text": chat, "n_prompt": int(chat_ids.shape[1]),
        "sampling": Sampling.study(model.generation_config, cfg["temperature"], cfg["top_p"]).as_dict(),
        "max_new_tokens": sizes.max_new_tokens, "token_ids": run.output,
        "response": tokenizer.decode(run.output, skip_special_tokens=True),
    }
    if mismatch:
        for r in rows:
            if r["status"] == "ok":
                r["status"], r["reason"] = "incorrect", mismatch
    return rows, texts


def _reference_margin(model: Any, prompt_ids: Any, prefix: list[int]) -> str:
    """How close transformers' own choice was at a mismatch: its top-2 logit gap against bf16's spacing."""
    import torch

    ids = torch.cat([prompt_ids, prompt_ids.new_tensor([prefix])], dim=1) if prefix else prompt_ids
    with torch.no_grad():
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    spacing = 2.0 ** (math.floor(math.log2(abs(float(top[0])) or 1.0)) - 7)
    return f"hf's top-2 logit gap there {float(top[0] - top[1]):.4g}, bf16 spacing {spacing:.4g}"


def _estimated_weight_bytes(resolved: ResolvedModel, dtype: str) -> int:
    """Parameter bytes from the config alone (modules built on the meta device: no memory, no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpulab.dtypes import ITEMSIZE

    config = AutoConfig.from_pretrained(resolved.path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()) * ITEMSIZE[dtype]


def kv_capacity(sizes: Sizes, chat_tokens: int) -> int:
    """Cache length that holds the longest sequence any test makes, rounded up to 64."""
    need = max(sizes.prompt_tokens + 1, sizes.gen_tokens + 1, chat_tokens + sizes.max_new_tokens,
               chat_tokens + sizes.check_tokens) + 1
    return -(-need // 64) * 64


def run_llm(resolved: ResolvedModel, engines: Sequence[str], cfg: Mapping[str, Any], *, target: str,
            fingerprint: str, copy_gbps: float, out_dir: str | Path, loaded: LoadedModel | None = None
            ) -> dict[str, Any]:
    """Measure ``engines`` on one model; write ``<out_dir>/<model>__<engine>.csv`` and ``.json`` for each.

    Returns the rows by engine. Problems (no GPU for a big model, out of memory, a failing engine)
    become rows with a status and a reason, never a missing file.
    """
    import torch

    from gpulab.device import detect

    info = detect()
    gpu = info.gpu_available
    device = info.torch_device
    dtype = str(cfg["dtype"])
    seed = int(cfg["seed"])
    sizes = Sizes.resolve(cfg, gpu)
    out = Path(out_dir)
    slug = model_slug(resolved.spec)
    aotriton = os.environ.get(AOTRITON_VARIABLE, "unset") if info.backend == "rocm" else "n/a (ROCm only)"
    base = {"target": target, "fingerprint": fingerprint, "model": resolved.spec, "model_source": resolved.source,
            "dtype": dtype, "device": info.name, "aotriton_experimental": aotriton, "seed": seed}
    tests = ["greedy", f"pp{sizes.prompt_tokens}", f"ttft{sizes.prompt_tokens}", f"tg{sizes.gen_tokens}", "study"]

    def outcome_rows(engine: str, status: str, reason: str) -> list[dict[str, Any]]:
        return [{**base, "engine": engine, "test": t if t != "greedy" else f"greedy{sizes.check_tokens}",
                 "status": status, "reason": reason} for t in tests if t != "greedy" or engine == "fast"]

    results: dict[str, list[dict[str, Any]]] = {}
    texts: dict[str, dict[str, Any]] = {}
    problem: tuple[str, str] | None = None
    try:
        if loaded is not None:
            pass  # measured again with other settings (e.g. both fast variants on one load)
        elif not gpu:
            estimate = _estimated_weight_bytes(resolved, dtype)
            if estimate > CPU_MAX_WEIGHT_BYTES:
                problem = ("skipped", f"no GPU ({info.reason}); {estimate / 1e9:.1f} GB of {dtype} weights would "
                                      "take hours per test on a CPU")
        if problem is None and loaded is None:
            loaded = load_model(resolved, device, dtype, seed)
            log.info("loaded %s (%s) in %.2f s: %.2f GB of weights", resolved.spec, resolved.source, loaded.load_s,
                     loaded.weight_bytes / 1e9)
    except Exception as exc:
        log.error("loading %s failed:\n%s", resolved.spec, traceback.format_exc())
        problem = (_error_status(exc), f"loading the model failed: {_first_line(exc)}")

    if loaded is not None:
        model = loaded.model
        attn_impl = str(model.config._attn_implementation)
        cfgm = model.config
        head_dim = getattr(cfgm, "head_dim", None) or cfgm.hidden_size // cfgm.num_attention_heads
        torch_dtype = model.lm_head.weight.dtype
        prefill_kernel = sdpa_kernel((1, cfgm.num_attention_heads, sizes.prompt_tokens, head_dim),
                                     (1, cfgm.num_key_value_heads, sizes.prompt_tokens, head_dim), True, device,
                                     torch_dtype)
        decode_kernel = sdpa_kernel((1, cfgm.num_attention_heads, 1, head_dim),
                                    (1, cfgm.num_key_value_heads, sizes.prompt_tokens, head_dim), False, device,
                                    torch_dtype)
        common = {**base, "attn_impl": attn_impl, "weight_bytes": loaded.weight_bytes, "load_s": loaded.load_s}
        chat = loaded.tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
        chat_tokens = len(loaded.tokenizer(chat).input_ids)
        study_sampling = Sampling.study(model.generation_config, cfg["temperature"], cfg["top_p"])
        eos = model.generation_config.eos_token_id
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        reference: list[int] | None = None
        for name in engines:
            try:
                if name == "hf":
                    engine: Any = HfEngine(loaded)
                    kernel = f"prefill {prefill_kernel} / decode {decode_kernel}"
                else:
                    if reference is None:
                        chat_ids = loaded.tokenizer([chat], return_tensors="pt").input_ids.to(device)
                        reference = HfEngine(loaded).greedy(chat_ids, sizes.check_tokens)
                    compile_ = gpu if cfg["compile"] == "auto" else bool(cfg["compile"])
                    engine = FastEngine(loaded, kv_capacity(sizes, chat_tokens), compile_, bool(cfg["fast_exact"]),
                                        str(cfg["fast_streams"]), study_sampling, eos_ids)
                    kernel = (f"prefill {prefill_kernel} / decode {decode_kernel}" if cfg["fast_exact"]
                              else f"prefill {prefill_kernel} / decode masked fixed-length (compiled)")
                rows, text = run_engine(engine, loaded, cfg, sizes, base={**common, "sdpa_kernel": kernel},
                                        reference_greedy=reference if name == "fast" else None,
                                        copy_gbps=copy_gbps, device=device, gpu=gpu)
                if name == "hf" and reference is None:
                    reference = text["greedy"]["tokens"]
            except Exception as exc:
                log.error("engine %s failed:\n%s", name, traceback.format_exc())
                rows, text = outcome_rows(name, _error_status(exc), f"engine {name}: {_first_line(exc)}"), {}
            finally:
                if gpu:
                    torch.cuda.empty_cache()
            results[name], texts[name] = rows, text
    else:
        for name in engines:
            results[name], texts[name] = outcome_rows(name, *problem), {"problem": problem[1]}

    for name in engines:
        text_file = f"{slug}__{name}.json"
        for r in results[name]:
            r["text_file"] = text_file
        LLM.write(results[name], out / f"{slug}__{name}.csv")
        document = {"model": resolved.spec, "model_source": resolved.source, "resolved": json.loads(resolved.to_json()),
                    "sizes": sizes.__dict__, "study_reported": study_mod.REPORTED, **texts[name]}
        write_atomic(out / text_file, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return results


def _copy_gbps(path: str | None, dtype: str) -> float:
    if not path:
        return math.nan
    from gpulab.ceilings import Ceilings

    return Ceilings.load(path).copy_gbps(dtype)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="model spec (tiny, random:<id>, a modelscope id, a directory)")
    parser.add_argument("--engine", action="append", choices=ENGINES, help="engine(s) to run (default: both)")
    parser.add_argument("--out", required=True, help="directory for <model>__<engine>.csv/.json")
    parser.add_argument("--tiny-dir", default=None, help="tiny model directory (built there if missing)")
    parser.add_argument("--ceilings", default=None, help="bench/ceilings.csv for the roofline")
    parser.add_argument("--target", default="local")
    parser.add_argument("--fingerprint", default="unrecorded")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override an llm config key, e.g. --set reps=5 --set fast_exact=false")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout, force=True)
    cfg = llm_defaults()
    for item in args.set:
        key, _, value = item.partition("=")
        cfg[key] = json.loads(value) if value[:1] in "[{\"0123456789tfn-" else value
    apply_aotriton_env(bool(cfg["aotriton_experimental"]))
    from gpulab.llm.models import resolve_model

    tiny_dir = args.tiny_dir
    if tiny_dir and not Path(tiny_dir, "config.json").is_file():
        from gpulab.llm.tiny import build_tiny

        build_tiny(tiny_dir, seed=int(cfg["seed"]))
    resolved = resolve_model(args.model, cfg, tiny_dir=tiny_dir)
    results = run_llm(resolved, args.engine or list(ENGINES), cfg, target=args.target, fingerprint=args.fingerprint,
                      copy_gbps=_copy_gbps(args.ceilings, str(cfg["dtype"])), out_dir=args.out)
    import pandas as pd

    frame = pd.DataFrame([r for rows in results.values() for r in rows])
    columns = [c for c in ("engine", "test", "status", "tok_s", "tok_s_sd", "mean_ms", "peak_alloc_gib",
                           "peak_reserved_gib", "gbps", "pct_of_copy_bw", "tokens_match", "reason") if c in frame]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(frame[columns].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
