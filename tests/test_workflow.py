"""The workflow as a user runs it: planning and config validation before any job."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1"]


def run_snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SNAKEMAKE, "--directory", str(workdir), "--configfile", str(REPO / "config.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_plans_the_default_workflow(tmp_path):
    # How long planning takes is a speed goal that .ci/run prints, not a test.
    proc = run_snakemake(tmp_path, "-n")
    assert proc.returncode == 0, proc.stderr
    assert "env_capture" in proc.stdout + proc.stderr


def test_bad_config_fails_before_any_job_and_writes_nothing(tmp_path):
    proc = run_snakemake(tmp_path, "--config", "bench={'dtypes': ['fp64']}")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "bench.dtypes[0]: 'fp64' is not allowed; expected one of 'fp32', 'fp16', 'bf16'" in output
    assert not (tmp_path / "results").exists()
    assert not (tmp_path / "reports").exists()


def test_unknown_key_fails(tmp_path):
    proc = run_snakemake(tmp_path, "-n", "--config", "sizes=3")
    assert proc.returncode != 0
    assert "unknown key 'sizes'" in proc.stdout + proc.stderr


def readme_config_args() -> list[list[str]]:
    """Every `--config ...` of a command in README.md and the documentation, as the shell would split it (read at
    test time, so commands added to them are covered too)."""
    import shlex

    text = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    fenced = [line for block in re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S) for line in block.splitlines()]
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S))
    found = []
    for command in (c for c in fenced + inline if "--config " in c):
        words = shlex.split(command[command.index("--config "):].split("#")[0])[1:]
        found.append(list(itertools.takewhile(lambda w: not w.startswith("-"), words)))
    return found


def test_readme_has_config_commands():
    # The docs show booleans, nested numbers and per-op sizes; if they stop, this test names the loss.
    joined = " ".join(" ".join(a) for a in readme_config_args())
    for expected in ("strict=true", "mlp=", "bench="):
        assert expected in joined


@pytest.mark.parametrize("config_args", readme_config_args(), ids=" ".join)
def test_readme_config_commands_dry_run(tmp_path, config_args):
    proc = run_snakemake(tmp_path, "-n", "--config", *config_args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "env_capture" in proc.stdout + proc.stderr


def test_tuning_sweeps_run_by_name_only(tmp_path):
    jobs = re.compile(r"^rule (\w+):", re.M)
    named = run_snakemake(tmp_path, "-n", "tune_triton", "tune_fast")
    assert named.returncode == 0, named.stderr[-2000:]
    assert {"tune_triton", "tune_triton_op", "tune_triton_table", "tune_fast", "tune_fast_run"} <= set(
        jobs.findall(named.stdout))
    default = run_snakemake(tmp_path, "-n")
    assert default.returncode == 0, default.stderr[-2000:]
    assert "report_render" in jobs.findall(default.stdout)
    assert not [job for job in jobs.findall(default.stdout) if job.startswith("tune")]
