"""The opt-in tuning sweeps: Triton launch candidates (gpulab.bench.tune) and engine fast's variants
(gpulab.llm.tune), on CPU: the tiny model, Triton skipped without a GPU and run in its interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.bench.registry import BenchContext
from gpulab.bench.tune import TUNE_TRITON, tune_op
from gpulab.core.device import detect
from gpulab.core.timing import TimingSettings
from gpulab.llm import tune
from gpulab.llm.bench import llm_defaults
from gpulab.llm.graphs import GraphSettings
from gpulab.llm.models import load_model, resolve_model
from gpulab.llm.roofline import Ceiling
from gpulab.llm.tiny import build_tiny
from gpulab.llm.tune import TUNE_FAST, against, tune_model

FAST = TimingSettings(min_time_s=0.001, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False)
SMALL = {**llm_defaults(), "prompt_tokens": 8, "gen_tokens": 8, "max_new_tokens": 8, "check_tokens": 8,
         "teacher_tokens": 16}
GRAPH_VARIANTS = [n for n, s in tune.VARIANTS.items() if s.graphs]
cpu_only = pytest.mark.skipif(detect().gpu_available, reason="what a machine without a GPU records")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    tiny_dir = build_tiny(tmp_path_factory.mktemp("tiny") / "tiny")
    return load_model(resolve_model("tiny", {}, tiny_dir=tiny_dir), "cpu", "bf16")


# -- tune_fast -------------------------------------------------------------------------------------------


@pytest.mark.slow
@cpu_only
def test_tune_fast_measures_the_cpu_variants_and_skips_the_graph_ones(tiny, tmp_path):
    rows = tune_model(tiny.resolved, SMALL, target="local", fingerprint="fp", ceiling=Ceiling(10.0, "read"),
                      variants=["eager", *GRAPH_VARIANTS], tokens=8)
    table = TUNE_FAST.write(rows, tmp_path / "fast.csv")
    assert list(TUNE_FAST.read(tmp_path / "fast.csv").columns) == TUNE_FAST.names
    eager = table[table["variant"] == "eager"].iloc[0]
    assert eager["status"] == "ok" and eager["default"], eager["reason"]  # llm.compile auto: eager on CPU
    assert eager["tok_s"] > 0 and eager["test"] == "tg8" and eager["tokens_match_default"]
    assert eager["pct_of_ceiling"] == pytest.approx(100 * eager["gbps"] / 10.0)
    skipped = table[table["variant"] != "eager"]
    assert sorted(skipped["variant"]) == sorted(GRAPH_VARIANTS) and set(skipped["status"]) == {"skipped"}
    assert skipped["reason"].str.startswith("device graphs need a GPU").all()


@pytest.mark.slow
def test_a_variant_whose_tokens_differ_is_marked(tiny, monkeypatch):
    perturbed = GraphSettings(compile=False, graphs=False, compile_mode="perturbed")
    monkeypatch.setitem(tune.VARIANTS, "perturbed", perturbed)
    real = tune.run_variant

    def run_variant(settings, *args):
        row, tokens = real(GraphSettings(compile=False, graphs=False) if settings == perturbed else settings, *args)
        return row, ([*tokens[:3], tokens[3] + 1, *tokens[4:]] if settings == perturbed else tokens)

    monkeypatch.setattr(tune, "run_variant", run_variant)
    rows = tune_model(tiny.resolved, {**SMALL, "compile": False, "graphs": "off"}, target="local", fingerprint="fp",
                      ceiling=Ceiling(10.0, "read"), variants=["perturbed"], tokens=8)
    by = {r["variant"]: r for r in rows}
    assert by["eager"]["default"] and by["eager"]["tokens_match_default"]
    assert by["perturbed"]["status"] == "ok" and not by["perturbed"]["tokens_match_default"]
    assert by["perturbed"]["first_mismatch"] == 3


def test_token_comparison_names_the_first_difference():
    assert against([1, 2, 3], [1, 2, 3]) == {"tokens_match_default": True, "first_mismatch": None}
    assert against([1, 2], [1, 2, 3]) == {"tokens_match_default": False, "first_mismatch": 2}
    assert against(None, [1]) == {} and against([1], None) == {}


def test_the_default_variant_is_the_engine_the_config_gives():
    assert tune.default_variant({"compile": "auto", "graphs": "auto"}, gpu=False) == "eager"
    assert tune.default_variant({"compile": "auto", "graphs": "auto"}, gpu=True) == "compile_graphs"
    assert tune.default_variant({"compile": True, "graphs": "off"}, gpu=True) == "compile"


# -- tune_triton -----------------------------------------------------------------------------------------


def test_tune_triton_without_a_gpu_records_skipped_rows(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if detect().gpu_available:
        pytest.skip("what a machine without a GPU records")
    rows = tune_op("softmax", [(37, 300), (8, 64)], ["fp32", "bf16"], FAST, BenchContext(detect(), "local"), "fp")
    table = TUNE_TRITON.write(rows, tmp_path / "softmax.csv")
    assert list(TUNE_TRITON.read(tmp_path / "softmax.csv").columns) == TUNE_TRITON.names
    assert len(table) == 4 and set(table["status"]) == {"skipped"}
    assert set(table["reason"]) <= {"Triton is not installed", "Triton needs a GPU driver: PyTorch is a CPU-only build"}


def test_softmax_candidates_are_launches_softmax_makes():
    pytest.importorskip("triton")
    from gpulab.kernels.triton.config import Target
    from gpulab.kernels.triton.softmax import launch_candidates, launch_choice

    nvidia = Target("cuda", 32, "sm_90")
    for rows, cols in ((16384, 1024), (65536, 256), (4096, 16384), (2048, 131072), (5, 40)):
        found = launch_candidates(rows, cols, 2, nvidia)
        assert found[0] == launch_choice(rows, cols, 2, nvidia) and len(set(found)) == len(found) > 1
        for launch in found:  # the overrides the sweep passes to softmax() make exactly this launch
            assert launch_choice(rows, cols, 2, nvidia, **launch.overrides()) == launch
            assert launch.kernel == "looped" or launch.block_m * launch.block_n <= 16384
        assert any(c.kernel == "looped" for c in found) == (cols >= 4096)
        assert any(c.kernel == "split" for c in found) == (cols > 16384)


@pytest.mark.slow
def test_tune_triton_in_the_interpreter_times_every_candidate():
    pytest.importorskip("triton")
    code = (
        "from gpulab.bench.registry import BenchContext\n"
        "from gpulab.bench.tune import tune_op\n"
        "from gpulab.core.device import detect\n"
        "from gpulab.kernels.triton.config import ELEMENTWISE_DEFAULT, elementwise_shapes\n"
        "from gpulab.core.timing import TimingSettings\n"
        "s = TimingSettings(min_time_s=0.001, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False)\n"
        "ctx = BenchContext(detect(), 'local')\n"
        "gelu = tune_op('gelu', [(1000,)], ['fp32'], s, ctx, 'fp')\n"
        "soft = tune_op('softmax', [(5, 40)], ['bf16'], s, ctx, 'fp')\n"
        "for rows in (gelu, soft):\n"
        "    assert {r['status'] for r in rows} == {'ok'}, [r['reason'] for r in rows]\n"
        "    assert sum(r['picked'] for r in rows) == 1 and sum(r['fastest'] for r in rows) == 1\n"
        "assert len(gelu) == len(elementwise_shapes())\n"
        "b, w = ELEMENTWISE_DEFAULT\n"
        "assert [r['config'] for r in gelu if r['picked']] == [f'BLOCK_SIZE={b} num_warps={w}']\n"
        "fastest = min(gelu, key=lambda r: r['median_ms'])\n"
        "assert fastest['fastest'] and fastest['gbps'] > 0\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr[-2000:]
