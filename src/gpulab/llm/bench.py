"""Rule ``llm_infer``: the study's run and llama-bench-style figures of one model through each engine.

Per engine, the correctness check first (no time is trusted before it: :mod:`gpulab.llm.checks`), then the
figures of :mod:`gpulab.llm.figures`. Problems (no GPU for a big model, out of memory, a failing engine)
become rows with a status and a reason, never a missing file.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gpulab.core.ceilings import CEILINGS
from gpulab.core.device import DeviceInfo, detect
from gpulab.core.tables import Column, TableSchema, write_atomic
from gpulab.llm import checks, figures, profile, study
from gpulab.llm.engines import EngineSkipped, HfEngine, engine_class, engines_described
from gpulab.llm.models import LoadedModel, ResolvedModel, import_transformers, load_model, model_slug
from gpulab.llm.probe import AOTRITON_VARIABLE, PeakMemory, attention_kernels
from gpulab.llm.roofline import Ceiling
from gpulab.llm.study import MESSAGES, Sampling

log = logging.getLogger(__name__)

CPU_MAX_WEIGHT_BYTES = 4 * 2**30  # bigger models are skipped on CPU: the study's 512 tokens would take hours

LLM = TableSchema(
    "llm",
    (
        Column("model", "str", "the spec as configured: tiny, random:<id>, a modelscope id or a directory"),
        Column("model_source", "str", "real | random | tiny: whose weights the row measured"),
        Column("engine", "str", engines_described()),
        Column("test", "str", "study | pp<N> | ttft<N> | tg<N> | greedy<N> | teacher<N> (llama-bench's names)"),
        Column("engine_detail", "str", "how the engine ran (versions, compilation, graphs, numerics)"),
        Column("graph_mode", "str", "device graphs as the engine ran them (llm.graphs; a failed capture: why)"),
        Column("dtype", "str", "weight and activation dtype"),
        Column("device", "str", "the device the row ran on"),
        Column("attn_impl", "str", "transformers' attention implementation of the loaded model"),
        Column("sdpa_kernel", "str", "attention kernels of prefill / decode"),
        Column("aotriton_experimental", "str", f"{AOTRITON_VARIABLE} as set for the run (read on ROCm only)"),
        Column("n_prompt", "int", "prompt tokens"),
        Column("n_gen", "int", "generated tokens per run (the study: up to and including end of sequence)"),
        Column("tok_s", "float", "tokens/s: prompt tokens (pp) or generated tokens (tg, study) over the mean time"),
        Column("tok_s_sd", "float", "standard deviation of tok_s over the repetitions (tok_s x cv)"),
        Column("peak_alloc_gib", "float", "peak allocated memory during the test, GiB (process RSS peak on CPU)"),
        Column("peak_reserved_gib", "float", "peak memory held by the caching allocator, GiB (RSS peak on CPU)"),
        Column("mem_counter", "str", "what the memory columns read"),
        Column("weight_bytes", "int", "bytes of all parameters (a tied table once)"),
        Column("kv_cache_bytes", "int", "bytes of the engine's static KV cache (empty for hf's dynamic cache)"),
        Column("bytes_per_token", "int", "bytes a decode step reads: weights without the input embedding table, "
               "plus the KV cache at the test's mean context length"),
        Column("gbps", "float", "achieved GB/s: bytes_per_token x tokens/s (decode rows)"),
        Column("gbps_all_weights", "float", "weight_bytes x tokens/s: the all-weights figure published numbers use"),
        Column("ceiling_gbps", "float", f"measured read-only bandwidth, GB/s ({CEILINGS.path})"),
        Column("ceiling_pattern", "str", "read, or the pattern that stood in for it and why"),
        Column("roofline_tok_s", "float", "tokens/s if every step read bytes_per_token at ceiling_gbps"),
        Column("pct_of_ceiling", "float", "gbps as % of ceiling_gbps"),
        Column("above_ceiling", "bool", "decode rows: gbps exceeds ceiling_gbps by more than the row's spread "
               "(p90/p10): a byte count or a ceiling not to be trusted, flagged as a benchmark row is"),
        Column("datasheet_gbps", "float", "the device's datasheet memory bandwidth "
               "(gpulab.core.datasheet); empty where "
               "the device is not listed"),
        Column("pct_of_datasheet", "float", "decode rows: gbps as % of datasheet_gbps"),
        Column("j_per_token", "float", "device energy per token (energy_j of one call over its tokens: n_prompt for "
               "pp, n_gen for tg and the study); empty where the energy is unknown (energy_reason says why)"),
        Column("tok_per_j", "float", "tokens per joule: 1 / j_per_token"),
        Column("load_s", "float", "model load time, s (tokenizer excluded, as the study timed it)"),
        Column("tokens_match", "bool", "greedy/teacher rows: the engine's tokens equal transformers'"),
        Column("first_mismatch", "int", "greedy/teacher rows: index of the first differing token"),
        Column("logit_rel_err", "float", "teacher rows: largest ‖Δ‖/‖ref‖ of float32 logits over the positions"),
        Column("worst_position", "int", "teacher rows: the position of that largest error"),
        Column("ref_self_err", "float", "teacher rows: largest ‖Δ‖/‖ref‖ of transformers' step-by-step run against "
               "its one forward pass (the model's own rounding noise floor); logit_rel_err may reach the larger of "
               "llm.teacher_tolerance and twice this"),
        Column("text_file", "str", "JSON beside the CSV with the prompts, responses and token ids"),
        Column("seed", "int", "seed of random weights, prompts and sampling"),
    ),
    measured=True,
    path="llm/{model}__{engine}.csv",
)


def llm_defaults() -> dict[str, Any]:
    """The ``llm`` section's defaults from the config schema (usable without jsonschema)."""
    from gpulab.core.schema import schema_file

    props = schema_file()["properties"]["llm"]["properties"]
    return {key: spec["default"] for key, spec in props.items() if "default" in spec}


@dataclass(frozen=True)
class Sizes:
    prompt_tokens: int
    gen_tokens: int
    max_new_tokens: int
    check_tokens: int
    teacher_tokens: int
    reps: int

    @classmethod
    def resolve(cls, cfg: Mapping[str, Any], gpu: bool) -> Sizes:
        def pick(key: str, gpu_value: int, cpu_value: int) -> int:
            value = cfg.get(key, "auto")
            return (gpu_value if gpu else cpu_value) if value == "auto" else int(value)

        return cls(pick("prompt_tokens", 512, 128), pick("gen_tokens", 128, 32), pick("max_new_tokens", 512, 128),
                   int(cfg["check_tokens"]), int(cfg["teacher_tokens"]), int(cfg["reps"]))

    def kv_capacity(self, chat_tokens: int) -> int:
        """Cache length holding the longest sequence any test makes (+1 for the next token), rounded up to 64."""
        need = max(self.prompt_tokens + 1, self.gen_tokens + 1, chat_tokens + self.max_new_tokens,
                   chat_tokens + self.check_tokens, self.teacher_tokens) + 1
        return -(-need // 64) * 64


@dataclass
class Job:
    """One model and its settings for one run of the step."""

    resolved: ResolvedModel
    cfg: Mapping[str, Any]
    sizes: Sizes
    info: DeviceInfo
    base: dict[str, Any]
    ceiling: Ceiling


def prompts_of(loaded: LoadedModel, job: Job) -> dict[str, torch.Tensor]:
    """The study's chat prompt and the seeded random ids of pp and teacher forcing (as llama-bench uses)."""
    tokenizer, device = loaded.tokenizer, job.info.torch_device
    chat = tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
    high = min(int(tokenizer.vocab_size), int(loaded.model.config.vocab_size))
    generator = torch.Generator().manual_seed(int(job.cfg["seed"]))
    pp_ids = torch.randint(0, high, (1, job.sizes.prompt_tokens), generator=generator)
    teacher = torch.randint(0, high, (job.sizes.teacher_tokens,), generator=generator)
    return {"chat_text": chat, "chat": tokenizer([chat], return_tensors="pt").input_ids.to(device),
            "pp": pp_ids.to(device), "tg": pp_ids[:, :1].to(device), "teacher": teacher.to(device)}


def _eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


def _make_engine(name: str, loaded: LoadedModel, job: Job, prompts: dict[str, Any]) -> Any:
    sampling = Sampling.study(loaded.model.generation_config, job.cfg["temperature"], job.cfg["top_p"])
    capacity = job.sizes.kv_capacity(int(prompts["chat"].shape[1]))
    return engine_class(name).create(loaded, capacity, job.cfg, sampling, _eos_ids(loaded.model))


def _check(engine: Any, loaded: LoadedModel, job: Job, prompts: dict[str, Any], texts: dict[str, Any]
           ) -> checks.Check | None:
    """The engine's own correctness check against transformers (none for hf, the reference)."""
    return engine.check(HfEngine(loaded), prompts, job.cfg, job.sizes.check_tokens, texts)


def run_engine(name: str, loaded: LoadedModel, job: Job
               ) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """All rows of one engine (the check first, then the figures), the texts for its JSON file, and where a
    decode token's time goes (:mod:`gpulab.llm.profile`)."""
    prompts = prompts_of(loaded, job)
    engine = _make_engine(name, loaded, job, prompts)
    texts: dict[str, Any] = {}
    memory = PeakMemory(job.info.gpu_available)
    bench = figures.Bench(engine, loaded.model, job.ceiling, job.info, job.sizes.reps, memory)
    check = _check(engine, loaded, job, prompts, texts)
    if check is not None:
        log.info("%s %s: %s %s", name, check.test, "ok" if check.ok else "incorrect", check.reason)
        bench.rows.append({"test": check.test, "status": "ok" if check.ok else "incorrect", "reason": check.reason,
                           **check.values})
    figures.pp(bench, prompts["pp"], loaded.weight_bytes)
    figures.ttft(bench, prompts["pp"], loaded.weight_bytes)
    figures.tg(bench, prompts["tg"], job.sizes.gen_tokens, loaded.weight_bytes)
    sampling = Sampling.study(loaded.model.generation_config, job.cfg["temperature"], job.cfg["top_p"])
    output = figures.study(bench, prompts["chat"], job.sizes.max_new_tokens, sampling, int(job.cfg["seed"]),
                           loaded.weight_bytes)
    kernels = _step_kernels(engine, bench, prompts, job, sampling)
    log.info("%s: prefill, decode and study tokens profiled", name)
    texts["study"] = {"messages": list(MESSAGES), "prompt_text": prompts["chat_text"],
                      "n_prompt": int(prompts["chat"].shape[1]), "sampling": sampling.as_dict(),
                      "max_new_tokens": job.sizes.max_new_tokens, "token_ids": output,
                      "response": loaded.tokenizer.decode(output, skip_special_tokens=True)}
    if check is not None and not check.ok:
        for row in bench.rows:
            row["status"], row["reason"] = ("incorrect", check.reason) if row["status"] == "ok" else \
                (row["status"], row["reason"])
    common = _engine_columns(engine, loaded, job, bench)
    return [{**common, **row} for row in bench.rows], texts, kernels


def _step_kernels(engine: Any, bench: figures.Bench, prompts: dict[str, Any], job: Job, sampling: Sampling
                  ) -> list[dict[str, Any]]:
    """Where a prefill's, a decode token's and a study token's time goes: each profiled once more, beside its
    row's time (a study token: the study's call for a few tokens, its short prompt's prefill included)."""
    rows: list[dict[str, Any]] = []
    for prefix in ("pp", "tg", "study"):
        row = next((r for r in bench.rows if r["test"].startswith(prefix)), None)
        if row is None or row["status"] != "ok":
            reason = f"no ok {prefix} row to set the kernels beside"
            rows.append({"test": prefix, "status": "skipped", "reason": reason})
            continue
        if prefix == "pp":
            run, steps, step_us = (lambda: engine.prefill(prompts["pp"])), 1, row["mean_ms"] * 1e3
        elif prefix == "tg":
            steps = profile.PROFILED_TOKENS
            run, step_us = engine.decode_run(prompts["tg"], steps), row["mean_ms"] * 1e3 / row["n_gen"]
        else:
            study_run = figures.StudyRun(engine, prompts["chat"], profile.PROFILED_TOKENS, sampling, warm_up=False)
            run, steps = study_run, study_run.made
            step_us = row["mean_ms"] * 1e3 / row["n_gen"]
        rows += profile.step_kernels(row["test"], run, steps, step_us, job.info)
    return rows


def _engine_columns(engine: Any, loaded: LoadedModel, job: Job, bench: figures.Bench) -> dict[str, Any]:
    """The columns every row of the engine shares."""
    model = loaded.model
    kernels = attention_kernels(model.config, job.sizes.prompt_tokens, job.info.torch_device,
                                model.lm_head.weight.dtype, engine.decode_cache_len)
    return {**job.base, "engine": engine.name, "engine_detail": engine.detail, "graph_mode": engine.graph_mode,
            "attn_impl": str(model.config._attn_implementation), "sdpa_kernel": kernels, "load_s": loaded.load_s,
            "mem_counter": bench.memory.counter, "weight_bytes": loaded.weight_bytes,
            "kv_cache_bytes": engine.kv_cache_bytes,
            "ceiling_gbps": job.ceiling.gbps, "ceiling_pattern": job.ceiling.pattern}


def _estimated_weight_bytes(resolved: ResolvedModel, dtype: str) -> int:
    """Parameter bytes from the config alone (modules built on the meta device: no memory, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpulab.core.dtypes import ITEMSIZE

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolved.path))
    return sum(p.numel() for p in model.parameters()) * ITEMSIZE[dtype]


def load(job: Job) -> tuple[LoadedModel | None, tuple[str, str] | None]:
    """The model, or why there is none (a status and a reason)."""
    dtype = str(job.cfg["dtype"])
    log.info("loading %s on %s", job.resolved.spec, job.info.name)
    try:
        if not job.info.gpu_available:
            estimate = _estimated_weight_bytes(job.resolved, dtype)
            if estimate > CPU_MAX_WEIGHT_BYTES:
                return None, ("skipped", f"no GPU ({job.info.reason}); {estimate / 1e9:.1f} GB of {dtype} weights "
                                         "would take hours per test on a CPU")
        loaded = load_model(job.resolved, job.info.torch_device, dtype, int(job.cfg["seed"]))
        log.info("loaded %s in %.2f s: %.2f GB of weights", job.resolved.spec, loaded.load_s, loaded.weight_bytes / 1e9)
        return loaded, None
    except Exception as exc:
        log.error("loading %s failed:\n%s", job.resolved.spec, traceback.format_exc())
        return None, (figures.error_status(exc), f"loading the model failed: {figures.first_line(exc)}")


def _outcome_rows(job: Job, engine: str, status: str, reason: str) -> list[dict[str, Any]]:
    s = job.sizes
    check = engine_class(engine).check_tests(s.check_tokens, s.teacher_tokens)
    tests = [*check, f"pp{s.prompt_tokens}", f"ttft{s.prompt_tokens}", f"tg{s.gen_tokens}", "study"]
    return [{**job.base, "engine": engine, "test": t, "status": status, "reason": reason} for t in tests]


def kernels_path(out_dir: str | Path, spec: str, engine: str) -> Path:
    """Where the decode profile of one model and engine goes, beside its CSV (rule llm_infer's output)."""
    return Path(out_dir) / "kernels" / f"{model_slug(spec)}__{engine}.csv"


def _write(job: Job, engine: str, rows: list[dict[str, Any]], texts: dict[str, Any], kernels: list[dict[str, Any]],
           out: Path) -> None:
    slug = model_slug(job.resolved.spec)
    text_file = f"{slug}__{engine}.json"
    LLM.write([{**r, "text_file": text_file} for r in rows], out / f"{slug}__{engine}.csv")
    ours = {k: job.base[k] for k in ("target", "fingerprint", "model", "device")}
    profile.LLM_KERNELS.write([{**ours, "engine": engine, **k} for k in kernels], kernels_path(out, job.resolved.spec,
                                                                                              engine))
    document = {"model": job.resolved.spec, "model_source": job.resolved.source,
                "resolved": json.loads(job.resolved.to_json()), "sizes": asdict(job.sizes),
                "study_reported": study.REPORTED, **texts}
    write_atomic(out / text_file, json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def run_llm(resolved: ResolvedModel, engines: Sequence[str], cfg: Mapping[str, Any], *, target: str,
            fingerprint: str, ceiling: Ceiling, out_dir: str | Path, loaded: LoadedModel | None = None
            ) -> list[dict[str, Any]]:
    """Measure each of ``engines`` on one model, in order, in this process: the model loads once (on a GPU that
    was ~16 s of every engine's job: the interpreter, PyTorch and transformers' model classes). Writes
    ``<out_dir>/<model>__<engine>.csv`` and ``.json`` per engine; returns every engine's rows."""
    import_transformers()
    compile_ahead(resolved, engines, str(cfg["dtype"]))
    info = detect()
    aotriton = os.environ.get(AOTRITON_VARIABLE, "unset") if info.backend == "rocm" else "n/a (ROCm only)"
    base = {"target": target, "fingerprint": fingerprint, "model": resolved.spec, "model_source": resolved.source,
            "dtype": str(cfg["dtype"]), "device": info.name, "aotriton_experimental": aotriton,
            "seed": int(cfg["seed"])}
    job = Job(resolved, cfg, Sizes.resolve(cfg, info.gpu_available), info, base, ceiling)
    problem = None
    if loaded is None:
        loaded, problem = load(job)
    rows: list[dict[str, Any]] = []
    for engine in engines:
        rows += _run_one(job, engine, loaded, problem, Path(out_dir))
        _release(info)
    return rows


def compile_ahead(resolved: ResolvedModel, engines: Sequence[str], dtype: str) -> None:
    """Each engine's compiling that needs only the model's config (``compile_ahead``), on the probed GPU, before
    the job claims the device (gpulab.core.device_lock), so it runs while another job measures. A failure only leaves
    it to the engine's own preparation, which reports what fails."""
    import time

    from transformers import AutoConfig

    from gpulab.core.device import probe

    probed = probe()
    if not probed.gpu_available:
        return
    start = time.perf_counter()
    try:
        config = AutoConfig.from_pretrained(resolved.path)
        for engine in engines:
            engine_class(engine).compile_ahead(config, dtype, probed)
    except Exception as exc:
        log.warning("compiling ahead failed (%s: %s); the engines compile as they prepare", type(exc).__name__, exc)
        return
    log.info("compiled ahead for %s in %.1f s, before claiming the device", ", ".join(engines),
             time.perf_counter() - start)


def _run_one(job: Job, engine: str, loaded: LoadedModel | None, problem: tuple[str, str] | None, out: Path
             ) -> list[dict[str, Any]]:
    """One engine's rows, written; a failing engine becomes rows with its status and reason."""
    texts: dict[str, Any] = {"problem": problem[1]} if problem else {}
    if not problem:
        try:
            rows, texts, kernels = run_engine(engine, loaded, job)
        except EngineSkipped as exc:
            log.info("engine %s skipped: %s", engine, exc)
            problem = ("skipped", f"engine {engine}: {exc}")
        except Exception as exc:
            log.error("engine %s failed:\n%s", engine, traceback.format_exc())
            problem = (figures.error_status(exc), f"engine {engine}: {figures.first_line(exc)}")
    if problem:
        rows, kernels = _outcome_rows(job, engine, *problem), [{"status": problem[0], "reason": problem[1]}]
    _write(job, engine, rows, texts, kernels, out)
    return rows


def _release(info: DeviceInfo) -> None:
    """What the last engine held (its graphs, cache, compiled steps) goes back before the next one starts, so
    each engine's peak-memory columns count its own memory and the loaded model's only."""
    gc.collect()
    torch._dynamo.reset()
    if info.gpu_available:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
