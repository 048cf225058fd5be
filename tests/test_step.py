"""The step runner (gpulab.workflow.step): persistent compiler caches for every job."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pandas as pd
import pytest

from gpulab.core.paths import CACHE_ENV
from gpulab.workflow import step as step_module


def test_every_step_compiles_into_the_workflow_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(step_module, "to_log", lambda path: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the runner writes os.environ: keep the test's own
    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
        os.environ.pop(name, None)
    os.environ[CACHE_ENV] = str(tmp_path / "cache")
    job = SimpleNamespace(log=[str(tmp_path / "x.log")], config={}, input={}, output=[], params={},
                          wildcards=SimpleNamespace())
    names = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")
    # The step runs in a child process (gpulab.workflow.step.run_watched): what it saw reaches the test through a file.
    step_module.run(job, lambda step: (tmp_path / "seen.json").write_text(json.dumps({k: os.environ.get(k)
                                                                                      for k in names})))
    assert json.loads((tmp_path / "seen.json").read_text()) == {"TRITON_CACHE_DIR": str(tmp_path / "cache/triton"),
                    "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache/inductor"), "TRITON_CACHE_AUTOTUNING": "1"}


def test_a_cache_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    environ = {"TRITON_CACHE_DIR": "/elsewhere"}
    added = step_module.use_compiler_caches(environ)
    assert environ["TRITON_CACHE_DIR"] == "/elsewhere" and "TRITON_CACHE_DIR" not in added
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def measuring_job(tmp_path, **inputs):
    from gpulab.core.tables import Column, TableSchema

    table = TableSchema("t", (Column("op", "str"),), measured=True)
    out = tmp_path / "cells" / "add.csv"

    def main(step):
        table.write([{"target": "h200", "fingerprint": "ab12", "status": "ok", "op": "add", "median_ms": 0.5},
                     {"target": "h200", "fingerprint": "ab12", "status": "skipped", "op": "gelu"}], out)

    job = SimpleNamespace(log=[str(tmp_path / "logs/x.log")], config={}, input=SimpleNamespace(**inputs),
                          output=[str(out)], params={}, wildcards=SimpleNamespace())
    return job, main, out


def test_a_job_on_the_targets_machine_records_the_host_load_on_its_measured_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(step_module, "to_log", lambda path: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    job, main, out = measuring_job(tmp_path, env=str(tmp_path / "env.json"))
    step_module.run(job, main)
    loads = pd.read_csv(out)["host_load"].tolist()
    assert 0.0 <= loads[0] <= 1.0 and pd.isna(loads[1])


def test_a_job_without_the_targets_environment_records_no_host_load(monkeypatch, tmp_path):
    # An aggregate: its rows keep the loads of the cells it read.
    monkeypatch.setattr(step_module, "to_log", lambda path: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    job, main, out = measuring_job(tmp_path)
    step_module.run(job, main)
    assert pd.read_csv(out)["host_load"].isna().all()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_a_job_runs_beside_the_measuring_cpus_until_it_claims_the_device(monkeypatch, tmp_path, request):
    from gpulab.core import jobenv
    from gpulab.core.cores import set_process_cpus
    from gpulab.core.device_lock import claim_device

    monkeypatch.setattr(step_module, "to_log", lambda path: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    cpus = sorted(os.sched_getaffinity(0))
    request.addfinalizer(lambda: set_process_cpus(cpus))  # the runner's own process is kept off them too
    jobenv.put("measure_cores", str(cpus[-1]))
    job, write_table, out = measuring_job(tmp_path, env=str(tmp_path / "env.json"))

    def main(step):
        before = sorted(os.sched_getaffinity(0))
        claim_device(str(tmp_path / "device.lock"))
        (tmp_path / "seen.json").write_text(json.dumps([before, sorted(os.sched_getaffinity(0))]))
        write_table(step)

    step_module.run(job, main)
    assert json.loads((tmp_path / "seen.json").read_text()) == [cpus[:-1], cpus[-1:]]
    assert 0.0 <= pd.read_csv(out)["host_load"].iloc[0] <= 1.0
