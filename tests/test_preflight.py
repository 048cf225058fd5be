"""Pre-flight: settings whose tensors cannot fit the device fail before any job starts, naming estimate and limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.config import validate_config
from gpulab.preflight import GIB, PreflightError, check, estimates

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
