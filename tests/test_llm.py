"""LLM step: model resolution, the tiny model, engine fast against transformers, the measurements and the report.

Everything runs on CPU with the tiny model (bf16, as the study loads Qwen); the GPU figures of the 7B
architecture live in tests/fixtures/llm (measured on an H100) and feed the report test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpulab.core.device import detect
from gpulab.core.timing import Timing
from gpulab.llm import bench, checks, figures, probe, qwen2
from gpulab.llm.bench import LLM, Sizes, kernels_path, run_llm
from gpulab.llm.engines import ENGINES, ExactEngine, HfCompiledEngine, HfEngine
from gpulab.llm.exact import ExactDecoder
from gpulab.llm.fast import FastDecoder
from gpulab.llm.graphs import GraphSettings
from gpulab.llm.models import (
    ModelSpecError,
    ModelUnavailableError,
    ResolvedModel,
    load_model,
    model_slug,
    resolve_model,
    spec_kind,
)
from gpulab.llm.probe import PeakMemory
from gpulab.llm.profile import CATEGORIES, LLM_KERNELS, PROFILED_TOKENS
from gpulab.llm.roofline import Ceiling, bytes_per_token, kv_bytes_per_position, read_ceiling, weight_bytes_read
from gpulab.llm.sampling import next_token, top_k
from gpulab.llm.study import MESSAGES, Sampling
from gpulab.llm.tiny import SPECIAL_TOKENS, build_tiny

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "llm"
NO_NETWORK = {"MODELSCOPE_ENDPOINT": "http://127.0.0.1:9", "MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path):
    return load_model(resolve_model("tiny", {}, tiny_dir=tiny_dir), "cpu", "bf16")


def _chat_ids(loaded) -> torch.Tensor:
    text = loaded.tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
    return loaded.tokenizer([text], return_tensors="pt").input_ids


def _hf_greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             **Sampling.greedy().generate_kwargs())
    return out[0, ids.shape[1]:].tolist()


# -- model specs and resolution ----------------------------------------------------------------------------


def test_model_specs_are_classified_and_named_for_files():
    assert spec_kind("tiny") == "tiny"
    assert spec_kind("Qwen/Qwen2.5-7B-Instruct") == "modelscope"
    assert spec_kind("random:Qwen/Qwen2.5-7B-Instruct") == "random"
    assert spec_kind("/models/qwen") == "directory"
    assert spec_kind("./models/qwen") == "directory"
    assert model_slug("random:Qwen/Qwen2.5-7B-Instruct") == "random_Qwen__Qwen2.5-7B-Instruct"
    assert model_slug("Qwen/Qwen2.5-7B-Instruct") == "Qwen__Qwen2.5-7B-Instruct"
    for bad in ("Qwen", "random:Qwen", "a/b/c", "Qwen/Qwen 7B"):
        with pytest.raises(ModelSpecError, match="model spec"):
            spec_kind(bad)


def test_tiny_and_random_resolve_to_their_directories(tiny_dir):
    resolved = resolve_model("tiny", {}, tiny_dir=tiny_dir)
    assert (resolved.source, resolved.path, resolved.how) == ("tiny", str(tiny_dir), "built")
    with pytest.raises(ModelSpecError, match="llm_tiny_build"):
        resolve_model("tiny", {})
    random = resolve_model("random:Qwen/Qwen2.5-7B-Instruct", {"cache_dir": str(tiny_dir / "no-cache")},
                           tiny_dir=tiny_dir)
    assert random.source == "random" and Path(random.path, "config.json").is_file()
    assert json.loads(Path(random.path, "config.json").read_text())["hidden_size"] == 3584
    assert random.tokenizer_path == str(tiny_dir)  # the real tokenizer is not on disk here
    with pytest.raises(ModelSpecError, match=r"shipped: Qwen/Qwen2\.5-7B-Instruct"):
        resolve_model("random:Qwen/Qwen9-1T", {}, tiny_dir=tiny_dir)


def test_explicit_paths_resolve_without_modelscope(tiny_dir, tmp_path):
    direct = resolve_model(str(tiny_dir), {})
    assert (direct.source, direct.how, direct.path) == ("real", "directory", str(tiny_dir.resolve()))
    mapped = resolve_model("gpulab/tiny-test", {"local_paths": {"gpulab/tiny-test": str(tiny_dir)},
                                                "revisions": {"gpulab/tiny-test": "v1"}})
    assert (mapped.how, mapped.revision, mapped.path) == ("local path", "v1", str(tiny_dir.resolve()))
    with pytest.raises(ModelUnavailableError, match=r"no config\.json"):
        resolve_model(str(tmp_path), {})


def test_cached_modelscope_snapshot_is_used_without_network(tiny_dir, tmp_path, monkeypatch):
    for name, value in NO_NETWORK.items():
        monkeypatch.setenv(name, value)
    snapshot = tmp_path / "cache" / "models" / "gpulab--tiny-test" / "snapshots" / "master"
    shutil.copytree(tiny_dir, snapshot)
    resolved = resolve_model("gpulab/tiny-test", {"cache_dir": str(tmp_path / "cache")})
    assert (resolved.how, resolved.source, Path(resolved.path)) == ("modelscope cache", "real", snapshot)


def _resolve_offline(model: str, cache: Path) -> subprocess.CompletedProcess:
    # A fresh interpreter: modelscope reads its retry settings from the environment when imported.
    code = ("import sys; from gpulab.llm.models import resolve_model\n"
            f"resolve_model({model!r}, {{'cache_dir': {str(cache)!r}}})")
    env = {**os.environ, **NO_NETWORK, "PYTHONPATH": str(REPO_ROOT / "src")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_missing_model_without_network_fails_clearly_and_leaves_no_debris(tmp_path):
    cache = tmp_path / "new" / "cache"
    result = _resolve_offline("Qwen/Qwen2.5-7B-Instruct", cache)
    assert result.returncode != 0
    message = result.stderr.split("ModelUnavailableError:", 1)[-1]
    assert "could not download Qwen/Qwen2.5-7B-Instruct" in message
    assert str(cache) in message
    for way_out in ("llm.local_paths", "random:Qwen/Qwen2.5-7B-Instruct", "use tiny"):
        assert way_out in message
    assert not (tmp_path / "new").exists(), "the failed download left directories behind"


def test_failed_download_keeps_what_was_in_the_cache(tmp_path):
    cache = tmp_path / "cache"
    kept = cache / "models" / "other--model" / "snapshots" / "master"
    kept.mkdir(parents=True)
    (kept / "config.json").write_text("{}")
    result = _resolve_offline("gpulab/absent", cache)
    assert result.returncode != 0 and "gpulab/absent" in result.stderr
    dirs = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_dir())
    assert dirs == ["models", "models/other--model", "models/other--model/snapshots",
                    "models/other--model/snapshots/master"]


# -- the tiny model ----------------------------------------------------------------------------------------


def test_tiny_model_is_deterministic(tiny_dir, tmp_path):
    again = build_tiny(tmp_path / "again")

    def digest(path: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}

    assert digest(again) == digest(tiny_dir)
    assert digest(build_tiny(tmp_path / "other-seed", seed=1))["model.safetensors"] != digest(tiny_dir)[
        "model.safetensors"]


def test_tiny_model_is_a_qwen2_chat_model(tiny):
    config = tiny.model.config
    assert config.model_type == "qwen2" and config.num_key_value_heads < config.num_attention_heads
    assert type(tiny.tokenizer).__name__.startswith("Qwen2Tokenizer")
    text = tiny.tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\n你是一个才华横溢的诗人。<|im_end|>\n<|im_start|>user\n"
                    "你好，请用这台高性能显卡为我写一首关于 AMD 显卡逆袭的七言绝句。<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tiny.tokenizer(text).input_ids
    special = {tiny.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert ids.count(tiny.tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3 and special <= set(range(len(
        tiny.tokenizer)))
    assert tiny.tokenizer.decode(ids) == text  # byte-level BPE round-trips the Chinese prompt
    assert tiny.model.generation_config.eos_token_id == [tiny.tokenizer.eos_token_id, tiny.tokenizer.pad_token_id]
    assert all(p.dtype == torch.bfloat16 for p in tiny.model.parameters())
    assert tiny.weight_bytes == 2 * sum(p.numel() for p in tiny.model.parameters())


# -- the fast engines against transformers ---------------------------------------------------------------

EAGER = GraphSettings(compile=False, graphs=False)


@pytest.mark.slow
def test_fast_exact_greedy_tokens_equal_transformers(tiny):
    exact = ExactDecoder(tiny.model, 256, [], EAGER, "none")
    generator = torch.Generator().manual_seed(3)
    prompts = [_chat_ids(tiny)] + [torch.randint(0, 700, (1, n), generator=generator) for n in (1, 7, 40)]
    for ids in prompts:
        assert exact.generate(ids[0], 32, Sampling.greedy(), stop_at_eos=False) == _hf_greedy(tiny.model, ids, 32)


@pytest.mark.slow
def test_compiled_exact_decode_step_stays_bit_identical(tiny):
    # The GPU path's numerics on CPU: inductor fuses the elementwise work (rounding like eager), matmuls,
    # means and SiLU stay eager custom ops.
    exact = ExactDecoder(tiny.model, 256, [], GraphSettings(compile=True, graphs=False), "none")
    exact.prepare(Sampling.greedy())
    if exact.graphs.note:
        pytest.skip(f"torch.compile cannot build here: {exact.graphs.note}")
    for ids in (_chat_ids(tiny), torch.randint(0, 700, (1, 9), generator=torch.Generator().manual_seed(5))):
        assert exact.generate(ids[0], 32, Sampling.greedy(), stop_at_eos=False) == _hf_greedy(tiny.model, ids, 32)


def _teacher_ids(n: int = 96) -> torch.Tensor:
    return torch.randint(0, 700, (n,), generator=torch.Generator().manual_seed(11))


@pytest.mark.slow
def test_fast_passes_teacher_forcing_and_differs_from_transformers_only_in_rounding(tiny):
    ids = _teacher_ids()
    reference = HfEngine(tiny).logits(ids, 48)
    logits, chosen = FastDecoder(tiny.model, 128, [], EAGER).teacher(ids, 48)
    ok, reason, values = checks.compare_logits(logits, chosen, reference, 2e-2)
    assert ok, reason
    assert 0 < values["logit_rel_err"] <= 2e-2  # not the same bits (fused products), within the tolerance
    assert values["tokens_match"]
    exact_logits, _ = ExactDecoder(tiny.model, 128, [], EAGER, "none").teacher(ids, 48)
    assert torch.equal(exact_logits, reference)  # the verifier runs transformers' very operations


def test_a_prompts_next_token_runs_the_last_layer_for_the_last_position_only(tiny):
    """A prompt whose next token alone is wanted: the same last-position logits and greedy choice as the run that
    keeps every position, and the same cache (the decode steps after it attend to every position)."""
    fast = FastDecoder(tiny.model, 128, [], EAGER)
    ids = torch.randint(0, 100, (40,), generator=torch.Generator().manual_seed(3))
    every = fast.prefill(ids, Sampling.greedy(), all_logits=True)
    chosen, cache = fast.chosen.clone(), [t.clone() for t in (*fast.cache.k, *fast.cache.v)]
    last = fast.prefill(ids, Sampling.greedy())
    assert last.shape == (1, every.shape[1])
    assert float((last - every[-1:]).norm() / every[-1:].norm()) < 2e-2  # one-row products round elsewhere
    assert torch.equal(fast.chosen, chosen)
    assert all(torch.equal(a, b) for a, b in zip(cache, (*fast.cache.k, *fast.cache.v), strict=True))
    kept = qwen2.hidden(fast.weights, fast.cache, ids.view(1, -1), torch.arange(40), qwen2.prefill_attention,
                        last_only=True)
    assert kept.shape == (1, 1, fast.weights.dims.hidden)


@pytest.mark.slow
def test_teacher_forcing_catches_a_perturbed_weight(tiny):
    ids = _teacher_ids()
    reference = HfEngine(tiny).logits(ids, 48)
    fast = FastDecoder(tiny.model, 128, [], EAGER)
    layer = fast.weights.layers[1]
    generator = torch.Generator().manual_seed(0)
    noise = 0.02 * torch.randn(layer.wd.shape, generator=generator).to(layer.wd.dtype)
    fast.weights.layers[1] = layer._replace(wd=layer.wd + noise)  # this engine's copy only
    logits, chosen = fast.teacher(ids, 48)
    ok, reason, values = checks.compare_logits(logits, chosen, reference, 2e-2)
    assert not ok and f"position {values['worst_position']}" in reason and "> 0.02" in reason


def test_a_wrong_token_choice_is_caught_where_rounding_cannot_explain_it():
    reference = torch.tensor([[3.0, 1.0, 0.0], [2.0, 1.9995, 0.0]])
    close = reference + torch.tensor([[1e-3, -1e-3, 0.0], [-1e-3, 1e-3, 0.0]])
    assert checks.compare_logits(close, torch.tensor([0, 1]), reference, 2e-2)[0]  # position 1: a near tie
    ok, reason, values = checks.compare_logits(close, torch.tensor([1, 0]), reference, 2e-2)
    assert not ok and values["first_mismatch"] == 0 and "greedy token at position 0" in reason


@pytest.mark.slow
def test_fast_stops_at_end_of_sequence(tiny):
    ids = _chat_ids(tiny)
    free = FastDecoder(tiny.model, 256, [], EAGER).generate(ids[0], 40, Sampling.greedy(), stop_at_eos=False)
    stop_at = free[20]
    stopped = FastDecoder(tiny.model, 256, [stop_at], EAGER).generate(ids[0], 40, Sampling.greedy(), stop_at_eos=True)
    assert stopped == free[: free.index(stop_at) + 1]


@pytest.mark.slow
def test_a_failing_compilation_runs_eager_steps_and_says_why(tiny):
    from gpulab.llm.fast import decode_one_token

    fast = FastDecoder(tiny.model, 128, [], GraphSettings(compile=True, graphs=False))

    def broken(*args: object) -> None:  # what an inductor or capture failure looks like to the engine
        raise RuntimeError("inductor could not build the step")

    fast.step_fn = broken
    fast.prepare(Sampling.greedy())
    assert fast.graphs.mode == "off: compile/capture failed (RuntimeError: inductor could not build the step)"
    assert fast.step_fn is decode_one_token
    ids = _chat_ids(tiny)[0]
    eager = FastDecoder(tiny.model, 128, [], EAGER).generate(ids, 8, Sampling.greedy(), stop_at_eos=False)
    assert fast.generate(ids, 8, Sampling.greedy(), stop_at_eos=False) == eager


def test_fused_projections_are_views_transformers_still_uses(tiny):
    FastDecoder(tiny.model, 64, [], EAGER)
    attn = tiny.model.model.layers[0].self_attn
    wqkv = tiny.model._gpulab_fused[0][0]
    assert attn.q_proj.weight.data_ptr() == wqkv.data_ptr() and attn.k_proj.weight.is_contiguous()
    assert FastDecoder(tiny.model, 64, [], EAGER).weights.layers[0].wqkv is wqkv  # fused once


# -- transformers' own fast path -------------------------------------------------------------------------


def test_hf_compiled_without_a_gpu_is_skipped_with_the_reason(tiny, tmp_path):
    run_llm(tiny.resolved, ["hf_compiled"], SMALL, target="local", fingerprint="abc", ceiling=Ceiling(10.0, "read"),
            out_dir=tmp_path, loaded=tiny)
    table = LLM.read(tmp_path / "tiny__hf_compiled.csv")
    assert sorted(table["test"]) == sorted(["teacher48", "pp24", "ttft24", "tg8", "study"])
    assert set(table["status"]) == {"skipped"}
    assert set(table["reason"]) == {"engine hf_compiled: no GPU: transformers compiles the decode step on an "
                                    "accelerator (llm.compile auto; true compiles it on the CPU, false runs it "
                                    "eagerly)"}
    kernels = LLM_KERNELS.read(kernels_path(tmp_path, "tiny", "hf_compiled"))
    assert list(kernels["status"]) == ["skipped"]


def test_a_failing_compiled_step_becomes_rows_that_say_why(tiny, tmp_path, monkeypatch):
    from gpulab.llm import hf_compiled

    overwritten = "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run."

    def broken(self, ids, **kwargs):  # what the compiled decode step's failure looks like to the engine
        raise RuntimeError(overwritten)

    monkeypatch.setattr(hf_compiled.StaticGenerate, "generate", broken)
    run_llm(tiny.resolved, ["hf_compiled"], {**SMALL, "compile": True}, target="local", fingerprint="abc",
            ceiling=Ceiling(10.0, "read"), out_dir=tmp_path, loaded=tiny)
    table = LLM.read(tmp_path / "tiny__hf_compiled.csv")
    assert set(table["status"]) == {"failed"} and len(table) == 5
    assert set(table["reason"]) == {"engine hf_compiled: RuntimeError: transformers' compiled decode step failed in "
                                    f"its warm-up (RuntimeError: {overwritten})"}


def test_hf_compiled_runs_eagerly_when_told_to(tiny):
    """compile: false: transformers' generate over the static cache, uncompiled; its greedy tokens are the dynamic
    cache's, call after call (the one cache is emptied before each)."""
    engine = HfCompiledEngine(tiny, 128, EAGER_CFG)
    assert engine.graph_mode == "none (eager PyTorch)"
    assert "static KV cache of 128 positions" in engine.detail
    assert "eager decode step (llm.compile off)" in engine.detail
    assert engine.kv_cache_bytes == kv_bytes_per_position(tiny.model.config, 2) * 128
    for ids in (_chat_ids(tiny), torch.randint(0, 700, (1, 9), generator=torch.Generator().manual_seed(5))):
        assert engine.generate(ids, 16, Sampling.greedy(), stop_at_eos=False) == _hf_greedy(tiny.model, ids, 16)
    assert engine.first_token(_chat_ids(tiny)) == _hf_greedy(tiny.model, _chat_ids(tiny), 1)[0]


def test_hf_compiled_teacher_forcing_runs_through_generate_past_an_end_of_sequence(tiny):
    """Teacher forcing through generate: the prefill's last position and one decode step per given token, the
    tokens forced even where one ends a sequence; the verdict names the sequence's positions."""
    engine = HfCompiledEngine(tiny, 128, EAGER_CFG)
    ids = _teacher_ids(48)
    eos = tiny.model.generation_config.eos_token_id
    ids[[30, 40]] = torch.tensor(eos)
    logits, chosen = engine.teacher(ids, 24)
    assert logits.shape == (25, tiny.model.config.vocab_size) and torch.equal(chosen, logits.argmax(-1))
    reference = HfEngine(tiny).logits(ids, 24)
    assert float(((logits - reference[23:]).norm(dim=-1) / reference[23:].norm(dim=-1)).max()) < 2e-2
    check = checks.teacher_forcing(engine, HfEngine(tiny), ids, 2e-2)
    assert check.ok, check.reason
    assert check.test == "teacher48" and check.values["n_gen"] == 25 and check.values["worst_position"] >= 23
    ok, reason, values = checks.compare_logits(logits, (chosen + 1) % logits.shape[1], reference[23:], 2e-2,
                                               first=23)
    assert not ok and values["first_mismatch"] >= 23 and f"position {values['first_mismatch']} is" in reason


@pytest.mark.slow
def test_hf_compiled_compiles_its_decode_step_once_for_every_call(tiny):
    """compile: true on a CPU: transformers compiles the decode step in the warm-up (Inductor's CPU backend, no
    CUDA graphs), once: the one static cache keeps every later call on that graph, whatever its prompt or its
    sampling, and the compiled step passes teacher forcing."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # the model's compiled call may hold an earlier test's graph
    engine = HfCompiledEngine(tiny, 128, {**SMALL, "compile": True})
    assert engine.graphs_compiled == 1, engine.detail
    assert "decode step compiled by transformers (torch.compile mode default" in engine.detail
    assert engine.graph_mode == "none (torch.compile mode default: no GPU)"
    graphs = counters["stats"]["unique_graphs"]
    check = checks.teacher_forcing(engine, HfEngine(tiny), _teacher_ids(48), 2e-2)
    assert check.ok, check.reason
    for length in (1, 9, 17):
        ids = torch.randint(0, 700, (1, length), generator=torch.Generator().manual_seed(length))
        assert len(engine.generate(ids, 12, Sampling.greedy(), stop_at_eos=False)) == 12
    study = Sampling.study(tiny.model.generation_config, 0.7, 0.9)
    assert 0 < len(engine.generate(_chat_ids(tiny), 12, study, stop_at_eos=True)) <= 12
    assert counters["stats"]["unique_graphs"] == graphs


# -- sampling -------------------------------------------------------------------------------------------


def test_two_stage_top_k_equals_torch_topk():
    for n in (50, 5000, 152064):
        scores = torch.randn(n, generator=torch.Generator().manual_seed(n))
        for got, want in zip(top_k(scores, 20), torch.topk(scores, 20), strict=True):
            assert torch.equal(got, want)


def test_device_sampling_follows_transformers_processors():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    sampling = Sampling(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.05)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 500, generator=generator) * 3
    seen = torch.randint(0, 500, (1, 40), generator=generator)
    presence = torch.zeros(500, dtype=torch.bool)
    presence[seen[0]] = True
    scores = logits.clone()
    for processor in (RepetitionPenaltyLogitsProcessor(1.05), TemperatureLogitsWarper(0.7), TopKLogitsWarper(20),
                      TopPLogitsWarper(0.9)):
        scores = processor(seen, scores)
    expected = torch.softmax(scores[0], -1)
    torch.manual_seed(0)
    draws = torch.cat([next_token(logits, presence, sampling) for _ in range(4000)])
    counts = torch.bincount(draws, minlength=500).double() / len(draws)
    assert set(draws.tolist()) <= set(expected.nonzero().flatten().tolist())
    assert float((counts - expected.double()).abs().max()) < 0.03
    assert int(next_token(logits, presence, Sampling.greedy())) == int(logits.argmax())


# -- the measurements ------------------------------------------------------------------------------------


def test_statistics_of_a_measurement():
    timing = Timing(median_ms=100.0, p10_ms=90.0, p90_ms=110.0, mean_ms=100.0, min_ms=90.0, cv=0.05, reps=3,
                    warmup_reps=1, first_call_ms=500.0, timer="perf_counter", cache_policy="none")
    tok_s, sd = figures.mean_sd_tok_s(128, timing)
    assert tok_s == pytest.approx(1280.0) and sd == pytest.approx(64.0)
    cfg = {"prompt_tokens": "auto", "gen_tokens": 64, "max_new_tokens": "auto", "check_tokens": 32,
           "teacher_tokens": 256, "reps": 3}
    assert Sizes.resolve(cfg, gpu=True) == Sizes(512, 64, 512, 32, 256, 3)
    assert Sizes.resolve(cfg, gpu=False) == Sizes(128, 64, 128, 32, 256, 3)
    sizes = Sizes(512, 128, 512, 32, 256, 3)
    assert sizes.kv_capacity(80) >= 80 + 512 and sizes.kv_capacity(80) % 64 == 0
    memory = PeakMemory(gpu=False)
    memory.reset()
    blob = bytes(range(256)) * (2**18)  # 64 MiB actually written, so it is resident
    alloc, reserved = memory.read()
    assert alloc >= 64 / 1024 and reserved == alloc
    del blob


def test_aotriton_switch_is_set_from_config():
    environ: dict[str, str] = {}
    assert probe.apply_aotriton_env(True, environ) == "1" and environ[probe.AOTRITON_VARIABLE] == "1"
    assert probe.apply_aotriton_env(False, environ) == "0"


def test_decode_bytes_exclude_the_input_embedding_table(tiny):
    model = tiny.model
    embed = model.get_input_embeddings().weight
    assert weight_bytes_read(model) == tiny.weight_bytes - embed.numel() * 2 > 0
    kv = kv_bytes_per_position(model.config, 2)
    assert kv == 2 * 4 * 2 * 32 * 2  # K and V x 4 layers x 2 KV heads x head_dim 32 x bf16
    assert bytes_per_token(model, 10.5) == weight_bytes_read(model) + int(kv * 10.5)
    tied = load_model(tiny.resolved, "cpu", "bf16").model
    tied.lm_head.weight = tied.get_input_embeddings().weight  # a tied table is read whole by the head
    assert weight_bytes_read(tied) == sum(p.numel() for p in tied.parameters()) * 2


def test_read_only_ceiling_is_used_and_the_copy_ceiling_stands_in_with_a_note(tmp_path):
    from gpulab.core.ceilings import CEILINGS

    def row(kind: str, gbps: float, size: int = 2**30) -> dict:
        return {"target": "t", "fingerprint": "f", "status": "ok", "kind": kind, "dtype": "bf16", "size": size,
                "tensor_bytes": size, "method": "torch", "best": True, "gbps": gbps, "p10_ms": 1.0, "p90_ms": 1.0}

    CEILINGS.write([row("copy", 3000.0)], tmp_path / "copy.csv")
    assert read_ceiling(tmp_path / "copy.csv", "bf16") == Ceiling(3000.0, "copy (ceilings.csv has no read-only row)")
    CEILINGS.write([row("copy", 3000.0), row("read", 2000.0, 2**20), row("read", 3147.0)], tmp_path / "read.csv")
    assert read_ceiling(tmp_path / "read.csv", "bf16") == Ceiling(3147.0, "read")


SMALL = {**bench.llm_defaults(), "prompt_tokens": 24, "gen_tokens": 8, "max_new_tokens": 12, "check_tokens": 8,
         "teacher_tokens": 48}
EAGER_CFG = {**SMALL, "compile": False}  # hf_compiled on a CPU: eager unless compiling is asked for
FILLED = {
    "pp": ["tok_s", "tok_s_sd", "mean_ms", "n_prompt", "peak_alloc_gib", "peak_reserved_gib", "weight_bytes", "load_s",
           "first_call_ms", "reps", "attn_impl", "sdpa_kernel", "engine_detail", "graph_mode", "aotriton_experimental"],
    "ttft": ["mean_ms", "n_prompt", "peak_alloc_gib", "reps"],
    "tg": ["tok_s", "tok_s_sd", "gbps", "gbps_all_weights", "bytes_per_token", "ceiling_gbps", "roofline_tok_s",
           "pct_of_ceiling", "n_gen", "mean_ms"],
    "study": ["tok_s", "gbps", "pct_of_ceiling", "n_gen", "n_prompt", "peak_alloc_gib", "load_s", "mean_ms"],
    "greedy": ["tokens_match", "n_gen", "n_prompt"],
    "teacher": ["tokens_match", "logit_rel_err", "worst_position", "ref_self_err", "n_gen"],
}
CHECKS = {"hf": [], "fast": ["teacher48"], "fast_exact": ["greedy8"], "hf_compiled": ["teacher48"]}


def test_the_engine_registry_is_what_the_config_and_the_tables_ask():
    from gpulab.llm.profile import LLM_KERNELS
    from gpulab.workflow.config import load_schema, validate_config

    assert list(ENGINES) == ["hf", "fast", "fast_exact", "hf_compiled"]
    assert load_schema()["properties"]["llm"]["properties"]["engines"]["items"]["enum"] == list(ENGINES)
    assert validate_config({})["llm"]["engines"] == list(ENGINES)
    described = {c.name: c.description for c in [*LLM.columns, *LLM_KERNELS.columns]}
    assert all(name in described["engine"] for name in ENGINES)
    # each engine's correctness check names the rows a failure leaves (bench._outcome_rows)
    assert {name: cls.check_tests(8, 48) for name, cls in ENGINES.items()} == CHECKS
    with pytest.raises(ValueError, match="unknown engine 'vllm'; expected one of hf, fast, fast_exact, hf_compiled"):
        bench.engine_class("vllm")


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_engine_measures_the_tiny_model(tiny, tmp_path, engine):
    cfg = EAGER_CFG if engine == "hf_compiled" else SMALL  # compiled on a GPU only, unless told
    rows = run_llm(tiny.resolved, [engine], cfg, target="local", fingerprint="abc", ceiling=Ceiling(10.0, "read"),
                   out_dir=tmp_path, loaded=tiny)
    table = LLM.read(tmp_path / f"tiny__{engine}.csv")
    assert list(table.columns) == LLM.names and len(table) == len(rows)
    assert set(table["status"]) == {"ok"}, table[["test", "reason"]]
    assert sorted(table["test"]) == sorted(["pp24", "ttft24", "tg8", "study", *CHECKS[engine]])
    assert set(table["model_source"]) == {"tiny"} and set(table["fingerprint"]) == {"abc"}
    for row in table.itertuples():
        missing = [c for c in FILLED[str(row.test).rstrip("0123456789")] if pd.isna(getattr(row, c))]
        assert not missing, f"{engine} {row.test}: empty {missing}"
    tg = table[table["test"] == "tg8"].iloc[0]
    assert tg["bytes_per_token"] < tg["weight_bytes"]  # the input embedding table is not read
    assert tg["gbps"] == pytest.approx(tg["bytes_per_token"] * tg["tok_s"] / 1e9)
    assert tg["pct_of_ceiling"] == pytest.approx(100 * tg["gbps"] / 10.0)
    # A CPU: above a 10 GB/s stand-in ceiling, flagged; no datasheet figure; energy unknown with the reason.
    assert bool(tg["above_ceiling"]) == (tg["gbps"] > 10.0 * tg["p90_ms"] / tg["p10_ms"])
    assert pd.isna(tg["datasheet_gbps"]) and pd.isna(tg["pct_of_datasheet"])
    timed = table[table["mean_ms"].notna()]
    assert timed["energy_j"].isna().all() and timed["tok_per_j"].isna().all() and timed["j_per_token"].isna().all()
    assert timed["energy_reason"].str.startswith("unknown: no GPU").all()
    document = json.loads((tmp_path / f"tiny__{engine}.json").read_text())
    assert document["study"]["messages"][1]["content"] == MESSAGES[1]["content"]
    assert 0 < len(document["study"]["token_ids"]) <= 12
    assert document["study"]["sampling"]["do_sample"] and document["study"]["sampling"]["top_k"] == 20
    kernels = LLM_KERNELS.read(kernels_path(tmp_path, "tiny", engine))
    assert set(kernels["status"]) == {"ok"} and set(kernels["engine"]) == {engine}
    assert set(kernels["test"]) == {"pp24", "tg8", "study"}
    assert set(kernels["category"]) <= set(CATEGORIES) and "matmul" in set(kernels["category"])
    pp, study = (table[table["test"] == test].iloc[0] for test in ("pp24", "study"))
    # the study's call for PROFILED_TOKENS tokens, or fewer where it chose an end of sequence
    study_steps = int(kernels.loc[kernels["test"] == "study", "steps"].iloc[0])
    assert 0 < study_steps <= PROFILED_TOKENS
    for test, steps, step_us in (("tg8", PROFILED_TOKENS, 1e3 * tg["mean_ms"] / tg["n_gen"]),
                                 ("pp24", 1, 1e3 * pp["mean_ms"]),
                                 ("study", study_steps, 1e3 * study["mean_ms"] / study["n_gen"])):
        rows = kernels[kernels["test"] == test]
        assert (rows["steps"] == steps).all() and rows["step_us"].iloc[0] == pytest.approx(step_us)
        assert rows["share_of_step"].sum() == pytest.approx(rows["us_per_step"].sum() / step_us)


@pytest.mark.slow
def test_a_failed_check_marks_every_time_of_the_engine_incorrect(tiny, monkeypatch):
    def wrong(engine, hf, ids, tolerance):
        return checks.Check("teacher48", False, "teacher forcing: logits at position 7 differ", {})

    monkeypatch.setattr(checks, "teacher_forcing", wrong)
    job = bench.Job(tiny.resolved, SMALL, Sizes(8, 4, 4, 4, 48, 3), detect(), {"target": "local"},
                    Ceiling(float("nan"), "none"))
    rows, _, _ = bench.run_engine("fast", tiny, job)
    assert {r["status"] for r in rows} == {"incorrect"}
    assert {r["reason"] for r in rows} == {"teacher forcing: logits at position 7 differ"}


@pytest.mark.slow
def test_the_compiled_prefill_is_one_graph_for_every_prompt_length_and_matches_eager(tiny):
    """On a GPU the fast engine compiles its prefill's layer (dynamic shapes); Inductor's CPU backend runs the
    same trace here: one graph for every layer and for prompts of 16 and 40 tokens, the logits those of the eager
    layers up to bf16 rounding (fused kernels round in other places: the teacher-forcing check's 2e-2), for every
    position's logits and for the next token's alone."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # the one layer function is compiled once per process: an earlier test may have done it
    compiled = FastDecoder(tiny.model, 128, [], GraphSettings(compile=True, graphs=False))
    eager = FastDecoder(tiny.model, 128, [], GraphSettings(compile=False, graphs=False))
    graphs = counters["stats"]["unique_graphs"]
    for length in (16, 40):
        ids = torch.randint(0, 100, (length,), generator=torch.Generator().manual_seed(length))
        got = compiled.prefill(ids, Sampling.greedy(), all_logits=True)
        want = eager.prefill(ids, Sampling.greedy(), all_logits=True)
        assert float((got - want).norm() / want.norm()) < 2e-2
        # The next token alone: the last layer runs uncompiled for the last position, no second graph.
        got = compiled.prefill(ids, Sampling.greedy())
        assert float((got - want[-1:]).norm() / want[-1:].norm()) < 2e-2
    assert compiled.prefill_note == "compiled prefill (no device graphs)"
    assert eager.prefill_note == "eager prefill (no device graphs)"
    assert counters["stats"]["unique_graphs"] - graphs == 1


def test_a_greedy_mismatch_is_reported_with_transformers_margin(tiny):
    engine = ExactEngine(tiny, 128, {**SMALL, "compile": False, "graphs": "off"}, Sampling.greedy(), [])
    check, texts = checks.greedy_identity(engine, HfEngine(tiny), _chat_ids(tiny), 4)
    assert check.ok and texts["tokens"] == texts["hf_tokens"]
    hf = HfEngine(tiny)
    wrong = [*texts["tokens"][:2], texts["tokens"][2] + 1, texts["tokens"][3]]  # a reference that differs at 2
    hf.generate = lambda ids, n, sampling, stop_at_eos: wrong
    check, _ = checks.greedy_identity(engine, hf, _chat_ids(tiny), 4)
    assert not check.ok and check.values["first_mismatch"] == 2
    assert "differ from hf at token 2" in check.reason and "top-2 logit gap" in check.reason


def test_big_models_are_skipped_on_cpu_with_a_reason(tiny_dir, tmp_path):
    resolved = resolve_model("random:Qwen/Qwen2.5-7B-Instruct", {"cache_dir": str(tmp_path / "c")},
                             tiny_dir=tiny_dir)
    run_llm(resolved, ["fast"], SMALL, target="local", fingerprint="abc", ceiling=Ceiling(float("nan"), "none"),
            out_dir=tmp_path)
    table = LLM.read(tmp_path / "random_Qwen__Qwen2.5-7B-Instruct__fast.csv")
    assert set(table["status"]) == {"skipped"} and table["reason"].str.contains("GB of bf16 weights").all()
    assert set(table["model_source"]) == {"random"} and "teacher48" in set(table["test"])
    kernels = LLM_KERNELS.read(kernels_path(tmp_path, "random:Qwen/Qwen2.5-7B-Instruct", "fast"))
    assert list(kernels["status"]) == ["skipped"] and "GB of bf16 weights" in kernels["reason"].iloc[0]
    assert kernels["test"].isna().all()


def test_resolved_model_round_trips_through_json(tiny_dir, tmp_path):
    resolved = resolve_model("tiny", {}, tiny_dir=tiny_dir)
    (tmp_path / "m.json").write_text(resolved.to_json())
    assert ResolvedModel.read(tmp_path / "m.json") == resolved


# -- the report ------------------------------------------------------------------------------------------


def test_report_section_shows_the_study_beside_measured_gpu_rows(tmp_path):
    from gpulab.report.render import render_report
    from gpulab.workflow.config import load_config

    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    rendered = render_report(tmp_path / "results", tmp_path / "report.html", load_config(REPO_ROOT / "config.yaml"),
                             "pytest")
    assert not rendered.errors
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    section = html[html.index('id="llm"'):]
    for text in ("LLM inference", "9.28", "14.28", "昔日显皇N独尊", "random weights (speed and memory only)",
                 "191.4", "39.2", "against its read-only roofline",
                 "Prompt-processing tokens", "greedy32", "teacher256", "one device graph per step",
                 "device graphs per layer segment", "NVIDIA H100", "bytes per token",
                 "Where the time of a prefill, of a decode token and of a study token goes", "gemv_kernel",
                 "decode_attention_kernel", "not in a kernel"):
        assert text in section, text
    # It leads with fast's decode speed over its peers', from the same run's rows.
    csv = FIXTURES / "results" / "h100" / "llm" / "random_Qwen__Qwen2.5-7B-Instruct__{}.csv"
    tok_s = {e: float(LLM.read(str(csv).format(e)).set_index("test").loc["tg128", "tok_s"]) for e in ("fast", "hf")}
    lead = section[:section.index("How these figures were made")]
    assert (f"fast decodes random:Qwen/Qwen2.5-7B-Instruct on h100 at {tok_s['fast']:,.1f} tok/s (tg128): no "
            f"hf_compiled figure (not measured in this run); {tok_s['fast'] / tok_s['hf']:,.2f}× hf") in lead


def test_fast_leads_as_a_multiple_of_each_peer_or_says_why_a_peer_has_none():
    from gpulab.report.sections.llm import lead_ratios, lead_sentences

    failure = "engine hf_compiled: RuntimeError: transformers' compiled decode step failed in its warm-up"
    measured = [("fast", "tg128", 266.0), ("hf_compiled", "tg128", 133.0), ("hf", "tg128", 40.0),
                ("fast", "pp512", 50000.0), ("hf", "pp512", 12500.0), ("fast", "teacher256", None),
                ("fast", "study", 270.0), ("hf_compiled", "study", 135.0), ("hf", "study", 12.0)]
    rows = [{"target": "h200", "model": "m", "engine": e, "test": t, "status": "ok", "reason": "", "tok_s": v}
            for e, t, v in measured]
    rows.append({"target": "h200", "model": "m", "engine": "hf_compiled", "test": "pp512", "status": "failed",
                 "reason": failure, "tok_s": None})
    rows += [{"target": "cpu", "model": "tiny", "engine": e, "test": "tg32", "status": s, "reason": r, "tok_s": v}
             for e, s, r, v in (("fast", "ok", "", 30.0), ("hf_compiled", "failed", failure, None),
                                ("hf", "ok", "", 20.0))]
    df = pd.DataFrame(rows)
    ratios = lead_ratios(df)
    assert list(ratios["figure"]) == ["decode", "prefill", "study run", "decode"]
    assert list(ratios["test"]) == ["tg128", "pp512", "study", "tg32"]
    assert list(ratios["× hf_compiled"].fillna(-1)) == [2.0, -1, 2.0, -1]
    assert list(ratios["× hf"]) == [6.65, 4.0, 22.5, 1.5]
    assert lead_sentences(df, ratios) == [
        "fast decodes m on h200 at 266.0 tok/s (tg128): 2.00× hf_compiled's; 6.65× hf's.",
        f"fast decodes tiny on cpu at 30.0 tok/s (tg32): no hf_compiled figure (failed: {failure}); 1.50× hf's."]


def test_teacher_bound_is_the_tolerance_or_twice_the_references_own_noise():
    reference = torch.tensor([[3.0, 1.0, 0.0], [2.0, 0.0, 1.0]])
    off = reference * torch.tensor([[1.05, 0.95, 1.0], [1.05, 1.0, 0.95]])  # ~5% relative error, same argmax
    rel = float(((off - reference).norm(dim=-1) / reference.norm(dim=-1)).max())
    ok, reason, _ = checks.compare_logits(off, torch.tensor([0, 0]), reference, 2e-2)
    assert not ok and "> 0.02" in reason
    # The reference disagreeing with itself by 3% lets the engine differ by up to 6%, not more.
    assert checks.compare_logits(off, torch.tensor([0, 0]), reference, 2e-2, ref_self_err=0.03)[0]
    assert rel > 2 * 0.02
    ok, reason, _ = checks.compare_logits(off, torch.tensor([0, 0]), reference, 2e-2, ref_self_err=rel / 2.5)
    assert not ok and "2x transformers against itself" in reason


@pytest.mark.parametrize(("spec", "models", "tiny_device", "local_gpu_run", "expected"), [
    ("tiny", ["tiny", "random:Qwen/Qwen2.5-7B-Instruct"], "auto", True, True),  # the 7B runs the device paths
    ("tiny", ["tiny"], "auto", True, False),  # alone, the tiny model is what runs them
    ("tiny", ["tiny"], "cpu", True, True),
    ("tiny", ["tiny", "random:Qwen/Qwen2.5-7B-Instruct"], "device", True, False),
    ("tiny", ["tiny", "random:Qwen/Qwen2.5-7B-Instruct"], "auto", False, False),  # a cluster, or no GPU
    ("random:Qwen/Qwen2.5-7B-Instruct", ["tiny", "random:Qwen/Qwen2.5-7B-Instruct"], "cpu", True, False),
])
def test_only_the_tiny_model_moves_to_the_cpu_beside_the_device_jobs(spec, models, tiny_device, local_gpu_run,
                                                                     expected):
    from gpulab.llm.models import runs_on_cpu

    assert runs_on_cpu(spec, models, tiny_device, local_gpu_run) is expected
