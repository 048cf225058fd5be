"""Reruns follow content, as a user sees them: a small real run of the workflow in a copy of the repository,
then dry runs after an edit, a touch, a git round trip, a config change or a move of the checkout; and strict
mode's one judgement, which measures nothing again.

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

from gpulab.core.device import gpu_driver_present
from gpulab.toolchains.archs import ARCHS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SMALL = {
    "timing": {"min_time_s": 0.01, "min_reps": 3, "max_reps": 5, "warmup_reps": 1, "flush_cache": False,
               "min_span_s": 0},
    "ceilings": {"copy_mib": 1, "matmul_n": 64, "dtypes": ["fp32"]},
    "build": {"standalone_sizes": [1024]},
    "bench": {"ops": ["gelu", "add"], "impls": ["native", "triton"], "dtypes": ["fp32"],
              "sizes": {"gelu": [4096, 1000], "add": [1024]}},
    # tf32: a variant a CPU or ROCm machine records as skipped, which strict mode lists as expected there.
    "mlp": {"dim": 16, "num_layers": 1, "batch": 4, "num_steps": 1, "variants": ["fp32", "tf32"]},
    "llm": {"engines": ["hf"], "prompt_tokens": 8, "gen_tokens": 4, "max_new_tokens": 4, "check_tokens": 4},
}


def snakemake(workdir: Path, *args: str, timeout: int = 900, **environ: str) -> subprocess.CompletedProcess[str]:
    # The copy's Snakefile runs the copy's own gpulab, whatever is installed or on PYTHONPATH.
    env = {**os.environ,
           # The C++ extension compiled once for the repository serves the copies too (its key covers sources).
           "GPULAB_CACHE_DIR": os.environ.get("GPULAB_CACHE_DIR", str(REPO / ".cache")), **environ}
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


def test_every_run_records_its_outcomes(done):
    """Strict off: results/outcomes.csv still lists every outcome that is not ok (none: a header alone)."""
    outcomes = pd.read_csv(done / "results/outcomes.csv")
    assert list(outcomes.columns) == ["step", "table", "target", "row", "status", "reason", "expected"]
    assert set(outcomes["status"]) <= {"skipped", "failed", "incorrect", "oom", "unstable"}
    if not gpu_driver_present():  # the CPU records its Triton cells as skipped
        assert "op=gelu, impl=triton, dtype=fp32, size=4096" in set(outcomes["row"])


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


def test_editing_a_triton_kernel_reruns_that_cell_the_op_tables_and_the_report(done, tmp_path):
    work = tmp_path / "edit"
    shutil.copytree(done, work, symlinks=True)
    kernel = work / "kernels/triton/gelu.py"
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    proc = dry_run(work)
    # The ahead-of-time compile of every Triton kernel (one job per architecture) reads the kernel too.
    archs = len(ARCHS)
    # Every op's table reads every cell: a size's one ceiling may be set by any op's fastest row.
    ops = SMALL["bench"]["ops"]
    assert planned_jobs(proc) == {"bench_cell": 1, "bench_aggregate": len(ops), "kernels_compile": archs,
                                  "kernels_aggregate": 1, "outcomes_record": 1, "report_render": 1, "all": 1}
    assert planned_outputs(proc) == {"results/local/bench/cells/gelu__triton.csv", "reports/report.html",
                                     "results/outcomes.csv",
                                     *(f"results/local/bench/{op}.csv" for op in ops),
                                     "results/local/build/kernel_resources.csv",
                                     *(f"results/local/build/kernels/{arch}.csv" for arch in ARCHS)}


def test_changing_llm_engines_reruns_no_bench_or_mlp_job(done):
    jobs = planned_jobs(dry_run(done, "--config", "llm={engines: [hf, fast]}"))
    assert jobs.get("llm_infer") == 1
    assert not {j for j in jobs if j.startswith(("bench_", "mlp_", "env_", "extension", "hip_", "timing"))}, jobs


def test_a_moved_checkout_reruns_nothing(done, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(done, moved, symlinks=True)
    assert planned_jobs(dry_run(moved)) == {}


def test_a_checkout_runs_its_own_code_whatever_gpulab_is_importable(tmp_path):
    """Two copies; gpulab importable from copy A (PYTHONPATH wins over any install); a step run in copy B runs B's."""
    a, b = copy_checkout(tmp_path / "a"), copy_checkout(tmp_path / "b")
    for copy, name in ((a, "A"), (b, "B")):
        module = copy / "src/gpulab/env/capture.py"
        module.write_text(module.read_text() + f"\nprint('gpulab sentinel: checkout {name}', __file__)\n")
    proc = snakemake(b, "results/local/env/env.json", "--configfile", "config.yaml", "small.yaml",
                     PYTHONPATH=str(a / "src"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (b / "results/local/logs/env_capture.log").read_text()
    assert f"gpulab sentinel: checkout B {b / 'src/gpulab/env/capture.py'}" in log
    assert "checkout A" not in log and "checkout A" not in proc.stdout + proc.stderr


def tracked_files(work: Path) -> list[Path]:
    """The copy's files that git tracks in the repository (results and caches are not among them)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.decode()
    return [work / n for n in names.split("\0") if n and (work / n).is_file() and not (work / n).is_symlink()]


def test_touching_every_tracked_file_plans_nothing(done, tmp_path):
    work = tmp_path / "touched"
    shutil.copytree(done, work, symlinks=True)
    for path in tracked_files(work):
        path.touch()
    assert planned_jobs(dry_run(work)) == {}


def test_a_git_stash_round_trip_plans_nothing(done, tmp_path):
    """Local edits stashed and popped: the files get their content back with new times (and new inodes)."""
    work = tmp_path / "stashed"
    shutil.copytree(done, work, symlinks=True)
    git = ["git", "-c", "user.name=gpulab", "-c", "user.email=gpulab@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    edited = [work / "kernels/triton/gelu.py", work / "src/gpulab/core/timing.py",
              work / "workflow/scripts/bench_cell.py"]
    ran = {path: path.read_text() for path in edited}
    for path, text in ran.items():  # the commit differs from what ran: what ran is a local edit
        path.write_text(text + "\n# committed\n")
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=work, check=True)
    for path, text in ran.items():
        path.write_text(text)
    for action in (["stash", "-q"], ["stash", "pop", "-q"]):
        subprocess.run([*git, *action], cwd=work, check=True)
    assert {path: path.read_text() for path in edited} == ran
    assert planned_jobs(dry_run(work)) == {}


def test_kernels_compile_runs_in_a_copied_checkout(done):
    """The run's checkout is a copy: every Triton kernel compiled there, each recorded by its path in kernels/."""
    tables = [pd.read_csv(p) for p in sorted((done / "results/local/build/kernels").glob("*.csv"))]
    assert len(tables) == len(ARCHS)
    triton = pd.concat(tables).query("compiler.str.startswith('triton')")
    assert not triton.empty and set(triton["status"]) == {"ok"}, triton[["arch", "kernel", "reason"]]
    assert triton["source"].str.startswith("kernels/triton/").all()
    assert not [p for p in (done / "results/local/logs").glob("kernels_compile_*.log") if "subpath" in p.read_text()]


RULES = ("env_capture", "bench_ceilings", "bench_cell", "bench_aggregate", "hip_standalone", "extension_build",
         "timing_pitfalls", "kernels_compile", "kernels_aggregate", "mlp_profile", "llm_tiny_build", "llm_model_fetch",
         "llm_infer", "report_render", "outcomes_record", "outcomes_check")


def own_params_changed(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Per rule, the planned jobs whose reason includes a change of their own params."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts: dict[str, int] = {}
    for m in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n)*)", proc.stdout + proc.stderr, re.M):
        if re.search(r"^    reason: .*Params have changed", m[2], re.M):
            counts[m[1]] = counts.get(m[1], 0) + 1
    return counts


def params_changed(work: Path, *config: str) -> dict[str, int]:
    """Per rule, the jobs whose own params differ from their last run's. A dry run names a job's own params change
    only where nothing upstream of it reruns, so each round leaves out the rules found so far (--allowed-rules:
    their results then count as given) until a round finds none."""
    found: dict[str, int] = {}
    while True:
        allowed = [rule for rule in RULES if rule not in found]
        changed = own_params_changed(dry_run(work, *config, "--allowed-rules", "all", *allowed))
        if not changed:
            return found
        found.update(changed)


CELLS = len(SMALL["bench"]["ops"]) * len(SMALL["bench"]["impls"])
# Each top-level key changed to another valid value, and the jobs that read it. The report's params are the
# whole configuration, so it follows every key.
SWEEP = {
    "strict": ("strict=true", {}),
    "timing": ("timing={min_reps: 4}",
               {"bench_ceilings": 1, "bench_cell": CELLS, "hip_standalone": 1, "timing_pitfalls": 1, "mlp_profile": 1}),
    "env_capture": ("env_capture={tool_timeout_s: 7}", {"env_capture": 1}),
    "ceilings": ("ceilings={matmul_n: 32}", {"bench_ceilings": 1}),
    "build": ("build={standalone_sizes: [2048]}", {"hip_standalone": 1}),
    "bench": ("bench={max_tensor_mib: 64}", {"bench_ceilings": 1, "bench_cell": CELLS}),
    "mlp": ("mlp={num_steps: 2}", {"mlp_profile": 1}),
    "llm": ("llm={prompt_tokens: 16}", {"llm_infer": 1}),
    "report": ("report={title: another}", {}),
    # Which CPUs measure is where a job runs, not what it measures: only the report, which records it, follows.
    "measure_cores": ("measure_cores=2", {}),
    # A target's extra environment reaches every step that runs on its device.
    "targets": ('targets={local: {env: {GPULAB_PROBE: "1"}}}',
                {"env_capture": 1, "bench_ceilings": 1, "bench_cell": CELLS, "hip_standalone": 1, "extension_build": 1,
                 "timing_pitfalls": 1, "mlp_profile": 1, "llm_infer": 1}),
}


def test_the_sweep_covers_every_setting():
    from gpulab.workflow.config import load_schema

    assert {*SWEEP, "target", "results_dir"} == set(load_schema()["properties"])


@pytest.mark.parametrize("key", SWEEP)
def test_each_setting_reruns_exactly_the_steps_that_read_it(done, key):
    setting, readers = SWEEP[key]
    assert params_changed(done, "--config", setting) == {**readers, "report_render": 1}
    if key == "mlp":  # the MLP measures its own GEMMs' ceiling: no benchmark cell is measured again
        # The run's outcomes table follows the MLP's, as the report does.
        assert planned_jobs(dry_run(done, "--config", setting)) == {"mlp_profile": 1, "outcomes_record": 1,
                                                                    "report_render": 1, "all": 1}


@pytest.mark.parametrize("setting", ["target=elsewhere", "results_dir=elsewhere"])
def test_a_new_place_runs_everything_there_and_nothing_here(done, setting):
    # The run's own outcomes table lists another target's tables now, where it stays in place.
    moved = {"outcomes_record": 1} if setting.startswith("target=") else {}
    assert params_changed(done, "--config", setting) == {"report_render": 1, **moved}
    outputs = planned_outputs(dry_run(done, "--config", setting)) - {"reports/report.html", "results/outcomes.csv"}
    assert outputs and all("elsewhere/" in o for o in outputs), sorted(outputs)[:5]


def test_turning_strict_on_plans_the_judgement_and_no_measurement(done):
    assert planned_jobs(dry_run(done, "--config", "strict=true")) == {"outcomes_check": 1, "report_render": 1,
                                                                      "all": 1}
    assert planned_jobs(dry_run(done, "--config", "strict=false")) == {}


@pytest.mark.skipif(gpu_driver_present(), reason="asserts the outcomes a machine without a GPU records")
def test_strict_run_judges_every_table_in_one_summary_and_measures_nothing(done, tmp_path):
    work = tmp_path / "strict"
    shutil.copytree(done, work, symlinks=True)
    report = work / "reports/report.html"
    rendered = report.stat().st_mtime
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml", "--config", "strict=true")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "TypeError" not in out and "is not allowed" not in out
    ran = {span[0] for span in job_spans(max((work / ".snakemake/log").glob("*.snakemake.log")).read_text())}
    assert ran <= {"outcomes_check", "report_render"}, ran
    # The report still renders: it shows every outcome and its reason to the reviewer.
    assert report.stat().st_mtime > rendered
    summary = out[out.index("step(s) failed (reasons from their logs)"):]
    assert "outcomes_check.log" in summary and "strict mode:" in summary
    # Every table with a not-ok row is listed, with its step, row and reason; the CPU's expected ones apart.
    for line in ("local bench_cell (bench/gelu.csv) [op=gelu, impl=triton, dtype=fp32, size=4096] skipped:",
                 "local bench_cell (bench/add.csv) [op=add, impl=triton, dtype=fp32, size=1024] skipped:",
                 "local mlp_profile (mlp/summary.csv) [variant=tf32] skipped:",
                 "local bench_ceilings (bench/ceilings.csv) [kind=",
                 "local env_capture (env/tools.csv) [tool=",
                 "local extension_build (build/extension_checks.csv) [",
                 "expected on the target's machine (listed, not judged)"):
        assert line in summary, line
    assert "size=4096.0" not in summary
    # Off again: only the report follows the setting.
    assert planned_jobs(dry_run(work)) == {"report_render": 1, "all": 1}
