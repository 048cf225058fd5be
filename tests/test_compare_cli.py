"""``gpulab compare`` as a user and a CI gate meet it: a configuration change or another device is "not comparable",
never a regression, and ``--fail-on regression`` exits 2 with one line where it has nothing to read (no cell
judged, other devices, a target directory given as a results root); ``gpulab report`` refuses a target directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpulab.cli import REFUSED
from gpulab.cli import main as gpulab_main
from gpulab.core.tables import cell_key
from gpulab.core.timing import format_blocks, parse_blocks
from gpulab.report.compare import NOT_COMPARABLE, SLOWER, WITHIN, run_deltas

CPU_RUN = Path(__file__).resolve().parent / "fixtures" / "report" / "results" / "cpu"
# A few tables of the recorded CPU run: enough for every kind of verdict, small enough to render quickly.
KEPT = ("env/env.json", "mlp/summary.csv", "bench/gelu.csv", "benchmarks/mlp_profile.jsonl")
# Two kept runs named as the workflow names them: time, commit, configuration digest.
RUNS = ("20261201T100000Z__e368919__1bc052714c90", "20261201T110000Z__e368919__90d13dbd21fb")
H100 = {"name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "arch": "sm_90", "gpu_available": True}


def _target(dest: Path, name: str = "local") -> Path:
    """The kept tables of the recorded CPU run as target ``name`` (``dest`` is the target directory)."""
    for rel in KEPT:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(CPU_RUN / rel, dest / rel)
    for rel in KEPT:
        if rel.endswith(".csv"):
            table = pd.read_csv(dest / rel)
            table.assign(target=name).to_csv(dest / rel, index=False)
    return dest


def _mlp_dim(target: Path, dim: int, slower: float) -> None:
    """The MLP rerun at hidden size ``dim`` (``--config 'mlp={"dim":dim}'``): its steps ``slower`` times longer,
    and the step's recorded configuration says so."""
    path = target / "mlp" / "summary.csv"
    table = pd.read_csv(path)
    table["dim"] = dim
    ok = table["status"] == "ok"
    for column in ("median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms"):
        table.loc[ok, column] *= slower
    table.loc[ok, "times_ms"] = [format_blocks([slower * b for b in parse_blocks(times)])
                                 for times in table.loc[ok, "times_ms"]]
    table.to_csv(path, index=False)
    record = target / "benchmarks" / "mlp_profile.jsonl"
    job = json.loads(record.read_text().splitlines()[0])
    job["params"]["mlp"]["dim"] = dim
    record.write_text(json.dumps(job) + "\n")


def _on_h100(target: Path) -> None:
    env_path = target / "env" / "env.json"
    env = json.loads(env_path.read_text())
    env["device"].update(H100)
    env_path.write_text(json.dumps(env))


@pytest.fixture
def kept_runs(tmp_path, monkeypatch) -> Path:
    """``results/local`` with two kept runs, the second with ``mlp={"dim":512}``; the working directory is the
    checkout's, so the commands read as the user typed them."""
    local = tmp_path / "results" / "local"
    _target(local)
    for run in RUNS:
        _target(local / "history" / run)
    _mlp_dim(local / "history" / RUNS[1], 512, slower=3.766)
    _mlp_dim(local, 512, slower=3.766)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _compare(capsys, *args: str) -> tuple[int, str]:
    code = gpulab_main(["compare", *args, "-o", "reports/compare.html"])
    return code, capsys.readouterr().err


def test_a_configuration_change_is_not_comparable_not_a_regression(kept_runs, capsys):
    code, err = _compare(capsys, "results/local@-2", "results/local@-1", "--fail-on", "regression")
    assert code == 0, err  # the GeLU cells, as they were, were judged: nothing regressed
    assert f"config digest {RUNS[0].rsplit('__', 1)[1]}" in err and f"config digest {RUNS[1].rsplit('__', 1)[1]}" in err
    assert "local on AMD EPYC (cpu, 2 cores), commit e368919" in err
    assert 'configuration keys that differ: mlp.dim ("auto" → 512)' in err
    assert "not comparable local mlp/summary.csv [variant=fp32] dim: 256 → 512" in err
    assert "8 not comparable" in err and SLOWER not in err and "regression(s)" not in err
    page = (kept_runs / "reports" / "compare.html").read_text()
    assert "1bc052714c90" in page and "90d13dbd21fb" in page and "mlp.dim" in page
    assert '<td class="verdict-not-comparable">not comparable</td>' in page


def test_a_configuration_change_alone_leaves_the_gate_nothing_to_judge(kept_runs, capsys):
    for run in RUNS:
        (kept_runs / "results" / "local" / "history" / run / "bench" / "gelu.csv").unlink()
    code, err = _compare(capsys, "results/local@-2", "results/local@-1", "--fail-on", "regression")
    assert code == REFUSED
    assert err.rstrip().splitlines()[-1] == ("gpulab compare: cannot gate (--fail-on regression): no cell was judged "
                                             "in both runs (8 not comparable)")
    assert _compare(capsys, "results/local@-2", "results/local@-1")[0] == 0  # without a gate it only reports


def test_runs_on_other_devices_are_refused_unless_asked_for(tmp_path, capsys, monkeypatch):
    """A CPU run against an H100 run under one target name: no cell is faster or slower."""
    monkeypatch.chdir(tmp_path)
    _target(tmp_path / "cpu" / "local")
    h100 = _target(tmp_path / "h100" / "local")
    _on_h100(h100)
    _mlp_dim(h100, 2048, slower=0.5)
    code, err = _compare(capsys, "cpu", "h100", "--fail-on", "regression")
    assert code == REFUSED
    assert err.rstrip().splitlines()[-1] == (
        "gpulab compare: cannot gate (--fail-on regression): the devices differ (local: AMD EPYC (cpu, 2 cores) → "
        "NVIDIA H100 80GB HBM3 (cuda, sm_90)), so no cell is comparable; give --across-devices to judge them anyway")
    assert "cells: 53 not comparable" in err
    assert ("not comparable local bench/gelu.csv [op=gelu, impl=cpp_ext, dtype=bf16, size=98432] device: "
            "AMD EPYC (cpu, 2 cores) → NVIDIA H100 80GB HBM3 (cuda, sm_90)") in err
    code, err = _compare(capsys, "cpu", "h100", "--fail-on", "regression", "--across-devices")
    assert code == 0, err
    assert "not comparable local mlp/summary.csv [variant=fp32] dim: 256 → 2048" in err
    assert f"45 {WITHIN}" in err and "faster" not in err.split("cells: ", 1)[1]


def test_different_target_names_leave_the_gate_nothing_to_judge(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _target(tmp_path / "a" / "local")
    _target(tmp_path / "b" / "h100", "h100")
    code, err = _compare(capsys, "a", "b", "--fail-on", "regression")
    assert code == REFUSED
    assert err.rstrip().splitlines()[-1] == ("gpulab compare: cannot gate (--fail-on regression): no target in both "
                                             "runs (baseline: local; this run: h100)")


def test_a_target_directory_is_refused_naming_its_results_root(kept_runs, capsys):
    message = "results/local is a target directory; give its results root: results"
    with pytest.raises(SystemExit, match=message) as refused:
        gpulab_main(["compare", "results/local@-1", "results/local", "--fail-on", "regression"])
    assert refused.value.code == REFUSED
    assert capsys.readouterr().err.strip() == f"gpulab compare: {message}"
    with pytest.raises(SystemExit, match=message) as refused:
        gpulab_main(["report", "results/local", "-o", "reports/report.html"])
    assert refused.value.code == REFUSED and not (kept_runs / "reports").exists()


def test_the_command_exits_two_on_a_target_directory(kept_runs):
    done = subprocess.run([sys.executable, "-m", "gpulab.cli", "compare", "results/local@-1", "results/local",
                           "--fail-on", "regression"], capture_output=True, text=True, timeout=120)
    assert done.returncode == REFUSED
    assert done.stderr.strip() == "gpulab compare: results/local is a target directory; give its results root: results"


def test_cells_are_paired_on_their_declared_names_and_must_agree_on_their_settings():
    assert cell_key("mlp/summary.csv").settings == ("dim", "num_layers", "batch")
    times = format_blocks([np.full(10, 1.0)] * 8)
    row = {"target": "t", "status": "ok", "variant": "fp32", "num_layers": 4, "batch": 64, "median_ms": 1.0,
           "p10_ms": 1.0, "p90_ms": 1.0, "times_ms": times}
    a = pd.DataFrame([{**row, "dim": 256}, {**row, "variant": "bf16", "dim": 256}])
    b = pd.DataFrame([{**row, "dim": 512.0}, {**row, "variant": "bf16", "dim": 256.0, "median_ms": 3.0,
                                               "times_ms": format_blocks([np.full(10, 3.0)] * 8)}])
    deltas = run_deltas(a, b, ["variant"], settings=cell_key("mlp/summary.csv").settings).set_index("variant")
    assert deltas.loc["fp32", "verdict"] == NOT_COMPARABLE and deltas.loc["fp32", "note"] == "dim: 256 → 512"
    assert np.isnan(deltas.loc["fp32", "change_pct"])
    assert deltas.loc["bf16", "verdict"] == SLOWER  # 256 and 256.0 are one setting


def test_an_llm_test_with_other_lengths_is_not_comparable():
    row = {"target": "t", "status": "ok", "model": "tiny", "engine": "hf", "test": "study", "dtype": "bf16",
           "n_prompt": 80, "n_gen": 128, "median_ms": 400.0, "p10_ms": 390.0, "p90_ms": 410.0, "reps": 1}
    llm = cell_key("llm/tiny__hf.csv")
    deltas = run_deltas(pd.DataFrame([row]), pd.DataFrame([{**row, "n_gen": 64, "median_ms": 200.0}]),
                        list(llm.names), settings=llm.settings)
    assert list(deltas["verdict"]) == [NOT_COMPARABLE] and list(deltas["note"]) == ["n_gen: 128 → 64"]
