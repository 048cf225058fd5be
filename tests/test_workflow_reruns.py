"""Reruns follow edits, as a user sees them: a small real run of the workflow in a copy of the repository,
then dry runs after an edit, a config change or a move of the checkout; and strict mode's one summary.

The run is small (one dtype, two ops, explicit sizes, a one-layer MLP, a few LLM tokens) but real: every
job runs its script, so Snakemake records the params, inputs and code that decide reruns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpulab.device import gpu_driver_present
from gpulab.kernel_compile.archs import ARCHS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SMALL = {
    "timing": {"min_time_s": 0.01, "min_reps": 3, "max_reps": 5, "warmup_reps": 1, "flush_cache": False,
               "min_span_s": 0},
    "ceilings": {"copy_mib": 1, "matmul_n": 64, "dtypes": ["fp32"]},
    "build": {"standalone_sizes": [1024]},
    "bench": {"ops": ["gelu", "add"], "impls": ["native", "triton"], "dtypes": ["fp32"],
              "sizes": {"gelu": [4096, 1000], "add": [1024]}},
    "mlp": {"dim": 16, "num_layers": 1, "batch": 4, "num_steps": 1, "variants": ["fp32"]},
    "llm": {"engines": ["hf"], "prompt_tokens": 8, "gen_tokens": 4, "max_new_tokens": 4, "check_tokens": 4},
}


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH: the copy's Snakefile runs the copy's own gpulab, whatever is installed.
    env = {**os.environ,
           # The C++ extension compiled once for the repository serves the copies too (its key covers sources).
           "GPULAB_CACHE_DIR": os.environ.get("GPULAB_CACHE_DIR", str(REPO / ".cache"))}
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def copy_checkout(dest: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files, as a fresh clone would have them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if rel.startswith(("results/", "reports/")) or not (src.is_file() or src.is_symlink()):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    (dest / "small.yaml").write_text(yaml.safe_dump(SMALL))
    return dest


def planned_jobs(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The dry run's job counts per rule (its 'Job stats' table); empty when nothing is to be done."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("Reasons:", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def planned_outputs(proc: subprocess.CompletedProcess[str]) -> set[str]:
    return set(re.findall(r"^\s+output: (.+)$", proc.stdout + proc.stderr, re.M))


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    """A copy of the repository after a complete small run."""
    work = copy_checkout(tmp_path_factory.mktemp("checkout"))
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work


def dry_run(work: Path, *config: str) -> subprocess.CompletedProcess[str]:
    return snakemake(work, "-n", "--configfile", "config.yaml", "small.yaml", *config, timeout=120)


def test_second_run_does_nothing(done):
    assert planned_jobs(dry_run(done)) == {}


def test_explicit_sizes_reach_the_cells(done):
    cell = pd.read_csv(done / "results/local/bench/cells/gelu__native.csv")
    assert sorted(cell["size"].astype(int).unique()) == [1000, 4096]
    assert set(cell["status"]) == {"ok"}, cell[["size", "status", "reason"]]
    assert set(pd.read_csv(done / "results/local/bench/cells/add__native.csv")["size"].astype(int)) == {1024}


def test_every_job_has_a_benchmark_record_with_its_params(done):
    records = sorted((done / "results/local/benchmarks").glob("*.jsonl"))
    names = {p.stem for p in records}
    assert {"env_capture", "bench_ceilings", "bench_cell_gelu__triton", "bench_aggregate_add", "mlp_profile",
            "llm_infer_tiny", "extension_build", "hip_standalone", "timing_pitfalls"} <= names
    assert (done / "results/benchmarks/report_render.jsonl").is_file()
    cell = json.loads((done / "results/local/benchmarks/bench_cell_gelu__native.jsonl").read_text())
    assert cell["s"] > 0 and cell["params"]["sizes"] == [4096, 1000]
    html = (done / "reports/report.html").read_text()
    assert "Wall time per step" in html and "Critical path of" in html


def job_spans(log: str) -> list[tuple[str, bool, datetime, datetime]]:
    """Each finished job of a Snakemake log: (rule, uses the device, start, end), to the second."""
    stamp = r"^\[(\w{3} \w{3} +\d+ [\d:]{8} \d{4})\]\n"
    started = re.finditer(stamp + r"(?:local)?rule (\w+):\n((?:    .*\n)*)", log, re.M)
    ended = {m[2]: m[1] for m in re.finditer(stamp + r"Finished jobid: (\d+)", log, re.M)}

    def when(text: str) -> datetime:
        return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")

    spans = []
    for m in started:
        job = re.search(r"^    jobid: (\d+)$", m[3], re.M)[1]
        if job in ended:
            spans.append((m[2], bool(re.search(r"^    resources: .*\bgpu=", m[3], re.M)), when(m[1]), when(ended[job])))
    return spans


def test_device_jobs_run_one_at_a_time_and_cpu_jobs_beside_them(done):
    """The run had two cores: jobs that use the device (resources: gpu) never overlapped; CPU-only jobs ran beside
    them where the device is a GPU, and only beside each other where it is the CPU (it measures there)."""
    log = min((done / ".snakemake/log").glob("*.snakemake.log")).read_text()
    spans = job_spans(log)
    device, cpu_only = [s for s in spans if s[1]], [s for s in spans if not s[1]]
    assert {"env_capture", "bench_cell", "mlp_profile"} <= {s[0] for s in device}
    assert "kernels_compile" in {s[0] for s in cpu_only}
    # Times are whole seconds: a strict overlap of truncated times is a real one.
    overlaps = lambda a, b: a[2] < b[3] and b[2] < a[3]  # noqa: E731
    both = [(a[0], b[0]) for i, a in enumerate(device) for b in device[i + 1:] if overlaps(a, b)]
    assert not both, f"device jobs ran at the same time: {both}"
    beside = [(a[0], b[0]) for a in device for b in cpu_only if overlaps(a, b)]
    if gpu_driver_present():
        assert beside, "no CPU-only job ran beside a device job"
    else:
        assert not beside, f"CPU-only jobs ran beside a measurement on the CPU: {beside}"
        assert any(overlaps(a, b) for i, a in enumerate(cpu_only) for b in cpu_only[i + 1:]), \
            "CPU-only jobs never ran beside each other"


def test_editing_a_triton_kernel_reruns_that_cell_its_aggregate_and_the_report(done, tmp_path):
    work = tmp_path / "edit"
    shutil.copytree(done, work, symlinks=True)
    kernel = work / "kernels/triton/gelu.py"
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    proc = dry_run(work)
    # The ahead-of-time compile of every Triton kernel (one job per architecture) reads the kernel too.
    archs = len(ARCHS)
    assert planned_jobs(proc) == {"bench_cell": 1, "bench_aggregate": 1, "kernels_compile": archs,
                                  "kernels_aggregate": 1, "report_render": 1, "all": 1}
    assert planned_outputs(proc) == {"results/local/bench/cells/gelu__triton.csv", "results/local/bench/gelu.csv",
                                     "reports/report.html", "results/local/build/kernel_resources.csv",
                                     *(f"results/local/build/kernels/{arch}.csv" for arch in ARCHS)}


def test_changing_llm_engines_reruns_no_bench_or_mlp_job(done):
    jobs = planned_jobs(dry_run(done, "--config", "llm={engines: [hf, fast]}"))
    assert jobs.get("llm_infer") == 1
    assert not {j for j in jobs if j.startswith(("bench_", "mlp_", "env_", "extension", "hip_", "timing"))}, jobs


def test_a_moved_checkout_reruns_nothing(done, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(done, moved, symlinks=True)
    assert planned_jobs(dry_run(moved)) == {}


def test_strict_run_goes_on_and_ends_with_one_summary(done, tmp_path):
    work = tmp_path / "strict"
    shutil.copytree(done, work, symlinks=True)
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml", "--config", "strict=true")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "TypeError" not in out and "is not allowed" not in out
    summary = out[out.index("step(s) failed (reasons from their logs)"):]
    # keep-going: the independent Triton cells of both ops failed in the same run, each with its reason.
    for step in ("bench_cell_gelu__triton.log", "bench_cell_add__triton.log"):
        assert step in summary
    assert "strict mode" in summary and "skipped" in summary
    assert "size=4096]" in summary and "size=4096.0" not in summary
