"""Pre-flight: settings whose tensors cannot fit the device fail before any job starts, naming estimate and limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.workflow.config import validate_config
from gpulab.workflow.preflight import GIB, PreflightError, check, estimates

REPO = Path(__file__).resolve().parent.parent
LIMIT = (80 * GIB, "an 80 GiB GPU")


def test_the_default_settings_pass():
    check(validate_config({}), LIMIT)


def test_an_mlp_that_cannot_fit_names_its_estimate_and_the_limit():
    with pytest.raises(PreflightError) as err:
        check(validate_config({"mlp": {"dim": 10**12}}), LIMIT)
    message = str(err.value)
    assert "mlp (dim 1,000,000,000,000 x num_layers 64 x batch 1,024" in message
    assert "the limit is 80.0 GiB, an 80 GiB GPU" in message


def test_each_explicit_size_is_checked():
    config = validate_config({"bench": {"sizes": {"gelu": [1024, 2**40], "softmax": [[2**20, 2**20]]}},
                              "ceilings": {"copy_mib": 200_000, "matmul_n": 4096}})
    found = {what.split(" (")[0]: n for n, what in estimates(config)}
    assert found["bench gelu"] == 2**40 * 2 * (4 + 8) and found["ceilings matmul_n"] == 3 * 4096**2 * 4
    with pytest.raises(PreflightError, match=r"\(3\)") as err:
        check(config, LIMIT)
    assert "matmul_n" not in str(err.value)  # 192 MiB fits


def test_a_model_larger_than_the_device_is_named():
    config = validate_config({"llm": {"models": ["tiny", "random:Qwen/Qwen2.5-7B-Instruct"]}})
    [(_, what)] = [e for e in estimates(config) if e[1].startswith("llm")]
    assert what == "llm random:Qwen/Qwen2.5-7B-Instruct (7.6 B parameters in bf16)"
    check(config, LIMIT)
    with pytest.raises(PreflightError, match=r"llm random:Qwen/Qwen2.5-7B-Instruct .* needs at least 14.2 GiB"):
        check(config, (12 * GIB, "a 12 GiB GPU"))


def test_a_workflow_run_fails_at_once_before_any_job(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config",
                           "mlp={dim: 1000000000000}"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "PreflightError" in out and "needs at least" in out and "the limit is" in out
    assert "Building DAG" not in out


CLUSTER = {"h100": {"gpu_model": "h100", "runtime_min": 30}, "mi300x": {"gpu_model": "mi300x", "runtime_min": 90}}


def test_a_decode_longer_than_the_job_time_limit_is_named():
    config = validate_config({"targets": CLUSTER, "llm": {"models": ["random:Qwen/Qwen2.5-7B-Instruct"],
                                                          "engines": ["fast"], "gen_tokens": 10**6}})
    with pytest.raises(PreflightError) as err:
        check(config, LIMIT)
    message = str(err.value)
    # 3 timed repetitions of a million steps, each reading 15.2 GB at 10 TB/s: 76 min at least
    assert "llm_infer: llm random:Qwen/Qwen2.5-7B-Instruct (3,000,000 decode steps over 1 engine, each reading " \
           "15.2 GB at 10 TB/s) needs at least 76.2 min" in message
    assert "the limit is 30 min, targets.h100.runtime_min" in message


def test_the_default_settings_fit_a_cluster_and_a_local_run_has_no_time_limit():
    check(validate_config({"targets": CLUSTER, "llm": {"models": ["random:Qwen/Qwen2.5-7B-Instruct"]}}), LIMIT)
    check(validate_config({"timing": {"min_span_s": 10**6}}), LIMIT)


def test_a_rule_runtime_set_on_the_command_line_is_its_limit():
    config = validate_config({"targets": CLUSTER, "timing": {"min_span_s": 7200}})
    with pytest.raises(PreflightError, match=r"bench_cell: every benchmark cell .* the limit is 30 min"):
        check(config, LIMIT)
    check(config, LIMIT, runtime={"bench_cell": 180})
    with pytest.raises(PreflightError, match="the limit is 60 min, the runtime set for rule bench_cell"):
        check(config, LIMIT, runtime={"bench_cell": 60})


def test_an_mlp_whose_training_cannot_end_in_time_is_named():
    config = validate_config({"targets": CLUSTER, "mlp": {"dim": 2**17, "num_layers": 64, "batch": 2**17}})
    with pytest.raises(PreflightError) as err:
        check(config, (10**15, "a 1 PB device"))
    problems = [line for line in str(err.value).splitlines() if "mlp_profile" in line]
    assert len(problems) == 1 and "3 variants x 18 steps" in problems[0]


def test_a_cluster_run_whose_cells_outlast_their_time_limit_fails_before_any_job():
    base = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config",
            "targets={h100: {gpu_model: h100, runtime_min: 1}}", "timing={min_span_s: 120}"]

    def dry_run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base[:6], *extra, *base[6:]], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={**os.environ})

    refused = dry_run()
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Building DAG" not in out
    assert "bench_cell: every benchmark cell (timing.min_span_s 120 s) needs at least 2.0 min; the limit is 1 min, " \
           "targets.h100.runtime_min" in out
    longer = dry_run("--set-resources", "bench_cell:runtime=5")
    assert longer.returncode == 0, longer.stderr[-2000:]
