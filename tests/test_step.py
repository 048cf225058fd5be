"""The step runner (gpulab.workflow.step): persistent compiler caches for every job."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

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
