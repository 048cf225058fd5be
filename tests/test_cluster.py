"""Cluster placement: per-target Slurm resources, per-target environment, and the profile's dry run.

The real submission to a one-node Slurm cluster is .ci/slurm.sh (CI); these tests need no Slurm.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpulab.workflow.cluster import (
    TargetConfigError,
    apply_target_env,
    device_job_resources,
    target_job_resources,
)
from gpulab.workflow.config import ConfigError, validate_config

REPO = Path(__file__).resolve().parent.parent

TWO_TARGETS = {
    "targets": {
        "mi300x": {"partition": "mi300x", "gpu_model": "mi300x", "runtime_min": 90,
                   "env": {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}},
        "h100": {"partition": "h100", "gpu_model": "h100", "gpus": 2, "mem_mb": 64000},
    }
}


def config_with(**overrides):
    return validate_config(overrides)


def test_listed_target_gets_its_partition_gpus_time_and_memory():
    config = config_with(**TWO_TARGETS)
    assert target_job_resources(config, "mi300x") == {
        "slurm_partition": "mi300x", "slurm_account": None, "gpu": 1, "gpu_model": "mi300x",
        "runtime": 90, "mem_mb": 32000,
    }
    h100 = target_job_resources(config, "h100")
    assert (h100["slurm_partition"], h100["gpu"], h100["gpu_model"], h100["mem_mb"]) == ("h100", 2, "h100", 64000)


def test_runtime_grows_with_the_retry_attempt():
    config = config_with(**TWO_TARGETS)
    assert [target_job_resources(config, "mi300x", attempt)["runtime"] for attempt in (1, 2, 3)] == [90, 180, 270]


def test_cpu_only_target_asks_for_no_gpu_even_with_a_model():
    config = config_with(targets={"cpu": {"gpus": 0, "gpu_model": "h100"}})
    resources = target_job_resources(config, "cpu")
    assert resources["gpu"] == 0
    assert resources["gpu_model"] is None


def test_unlisted_target_is_an_error_naming_the_configured_ones():
    config = config_with(**TWO_TARGETS)
    with pytest.raises(TargetConfigError, match=r"'a100' is not configured under targets \(configured: h100, mi300x\)"):
        target_job_resources(config, "a100")


def test_plain_run_asks_for_one_gpu_and_leaves_the_rest_to_the_profile():
    assert device_job_resources(config_with()) == {"gpu": 1}


def test_rule_resources_are_evaluated_per_job_target():
    resources = device_job_resources(config_with(**TWO_TARGETS))
    assert set(resources) == {"gpu", "gpu_model", "runtime", "mem_mb", "slurm_partition"}
    job = SimpleNamespace(target="h100")
    assert {name: fn(job) for name, fn in resources.items()} == {
        "gpu": 2, "gpu_model": "h100", "runtime": 60, "mem_mb": 64000, "slurm_partition": "h100"}
    assert resources["runtime"](SimpleNamespace(target="mi300x"), attempt=2) == 180


def test_partition_set_for_some_targets_only_is_rejected():
    config = config_with(targets={"mi300x": {"partition": "mi300x"}, "h100": {}})
    with pytest.raises(TargetConfigError, match=r"targets\.h100\.partition is not set while other targets set theirs"):
        device_job_resources(config)


def test_account_for_all_targets_is_requested():
    config = config_with(targets={"a": {"account": "proj1"}, "b": {"account": "proj2"}})
    resources = device_job_resources(config)
    assert resources["slurm_account"](SimpleNamespace(target="b")) == "proj2"
    assert "slurm_partition" not in resources


def test_target_environment_is_exported_and_wins_over_inherited_values(capsys):
    config = config_with(**TWO_TARGETS)
    environ = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "PATH": "/usr/bin"}
    assert apply_target_env(config, "mi300x", environ) == {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"}
    assert environ == {"HSA_OVERRIDE_GFX_VERSION": "9.4.2", "PATH": "/usr/bin"}
    assert "HSA_OVERRIDE_GFX_VERSION=9.4.2 (replaces inherited '11.0.0')" in capsys.readouterr().out
    untouched = {"PATH": "/usr/bin"}
    assert apply_target_env(config, "h100", untouched) == {}
    assert apply_target_env(config_with(), "local", untouched) == {}
    assert untouched == {"PATH": "/usr/bin"}


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ({"h100": {"gpu_model": "h100 80gb"}}, "targets.h100.gpu_model: 'h100 80gb' is not allowed"),
        ({"h100": {"gpus": -1}}, "targets.h100.gpus: -1 is not allowed; expected integer >= 0"),
        ({"h100": {"env": {"BAD-NAME": "1"}}}, "BAD-NAME"),
        ({"h100": {"partitions": "h100"}}, "unknown key 'targets.h100.partitions'"),
        ({"h 100": {}}, "h 100"),
    ],
)
def test_bad_target_config_is_rejected_by_name(targets, message):
    with pytest.raises(ConfigError) as excinfo:
        validate_config({"targets": targets})
    assert message in str(excinfo.value)


def localrules_of_workflow() -> set[str]:
    """Rules declared to run on the submitting host (`localrules:` blocks, `localrule: True`)."""
    names: set[str] = set()
    for smk in sorted((REPO / "workflow/rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.findall(r"^localrules:\n((?:    \w+,?\n)+)", text, re.M):
            names.update(re.findall(r"\w+", block))
        names.update(re.findall(r"^rule (\w+):\n(?:    .*\n|\n)*?    localrule:\n        True", text, re.M))
    return names


def dry_run_jobs(output: str) -> list[dict[str, str]]:
    """Each job block of `snakemake -n` output as {rule, target, <resource>: value}."""
    jobs = []
    for block in re.split(r"\n(?=\[[^\]]+\]\n(?:local)?rule )", output):
        head = re.search(r"^(?:local)?rule (\w+):$", block, re.M)
        resources = re.search(r"^    resources: (.*)$", block, re.M)
        if not head or not resources:
            continue
        job = dict(item.split("=", 1) for item in resources.group(1).split(", "))
        target = re.search(r"^    wildcards: .*?\btarget=([^,\s]+)", block, re.M)
        job.update(rule=head.group(1), target=target.group(1) if target else "")
        jobs.append(job)
    return jobs


@pytest.mark.slow
def test_dry_run_of_two_targets_puts_gpu_jobs_on_their_partitions(tmp_path):
    two_targets = tmp_path / "two-targets.yaml"
    two_targets.write_text(yaml.safe_dump(TWO_TARGETS))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", str(REPO / "profiles/slurm"),
         "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(REPO / "config.yaml"), str(two_targets),
         "--config", f"report={{output: {tmp_path}/report.html}}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = dry_run_jobs(proc.stdout + proc.stderr)
    local = localrules_of_workflow()
    assert {"report_render", "all"} <= local
    device_jobs = [job for job in jobs if job["rule"] not in local]
    assert {job["target"] for job in device_jobs} == {"mi300x", "h100"}
    for job in device_jobs:
        spec = TWO_TARGETS["targets"][job["target"]]
        assert job["slurm_partition"] == spec["partition"], job
        assert job["gpu"] == str(spec.get("gpus", 1)), job
        assert job["gpu_model"] == spec["gpu_model"], job
        assert job["runtime"] == str(spec.get("runtime_min", 60)), job
        assert job["mem_mb"] == str(spec.get("mem_mb", 32000)), job
    for job in jobs:
        if job["rule"] in local:
            assert "gpu" not in job, f"local rule {job['rule']} asks for a GPU"
        else:
            assert job["target"], f"{job['rule']} has no target but would be submitted to a compute node"
    # The profile's defaults reach the jobs: every job gets its CPUs from default-resources.
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    assert all(job["cpus_per_task"] == str(profile["default-resources"]["cpus_per_task"]) for job in device_jobs
               if job["rule"] not in profile.get("set-resources", {}))


def test_the_step_runner_exports_the_target_environment_before_the_step(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from gpulab.workflow import step as step_module

    monkeypatch.setattr(step_module, "to_log", lambda path: None)
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the runner writes os.environ: keep the test's own
    config = config_with(**TWO_TARGETS)
    seen = tmp_path / "seen.json"  # the step runs in a child process: what it saw reaches the test through a file
    job = SimpleNamespace(log=[str(tmp_path / "x.log")], config=config, input={}, output=[], params={},
                          wildcards=SimpleNamespace(target="mi300x"))
    step_module.run(job, lambda step: seen.write_text(json.dumps(
        {"env": os.environ.get("HSA_OVERRIDE_GFX_VERSION"), "target": step.target})))
    assert json.loads(seen.read_text()) == {"env": "9.4.2", "target": "mi300x"}


def test_every_device_step_exports_its_target_environment_first():
    """A rule with `**gpu_resources` runs on the target's nodes; its script must apply the target's env."""
    device_scripts = []
    for smk in sorted((REPO / "workflow/rules").glob("*.smk")):
        for rule, body in re.findall(r"^rule (\w+):\n((?:    .*\n|\n)+)", smk.read_text(), re.M):
            if "**gpu_resources" not in body:
                continue
            script = re.search(r"^    script:\n        \"([^\"]+)\"", body, re.M)
            assert script, f"{rule} asks for a GPU but runs no script"
            device_scripts.append((rule, (smk.parent / script.group(1)).resolve()))
    assert {"env_capture"} <= {rule for rule, _ in device_scripts}
    for rule, script in device_scripts:
        text = script.read_text()
        # gpulab.workflow.step.run exports the target's environment before it calls the script's main.
        assert "run(snakemake, main)" in text, f"{rule}: {script.name} does not go through the step runner"
        # Nothing that starts a runtime at module level: HSA_OVERRIDE_GFX_VERSION acts at runtime start.
        early = re.findall(r"^(?:import|from) (torch|gpulab\.(?:device|timing))\b", text, re.M)
        assert not early, f"{rule}: {script.name} imports {early} before the target env"


def test_jobs_measuring_the_host_cpu_ask_for_no_gpu_and_keep_the_rest():
    from types import SimpleNamespace

    from gpulab.workflow.cluster import without_gpu_where

    resources = without_gpu_where({"gpu": 1, "runtime": lambda w, attempt=1: 30 * attempt},
                                  lambda w: w.model == "tiny")
    tiny, big = SimpleNamespace(model="tiny"), SimpleNamespace(model="random_Qwen")
    assert resources["gpu"](tiny) == 0 and resources["gpu"](big) == 1
    assert resources["runtime"](tiny, 2) == 60 and resources["runtime"](big) == 30
