"""Nothing measured is lost, as a user sees it in a real (small) workflow run: a target copied in from elsewhere
renders with a plain run and is never measured again here, a failed re-measurement keeps the last good table
(stale, measured again next run), and a forced measurement killed midway is measured again after --unlock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_workflow_reruns import REPO, SMALL, copy_checkout, planned_jobs, planned_outputs, snakemake

from gpulab.core import history

pytestmark = pytest.mark.slow

CELL = "results/local/bench/cells/gelu__native.csv"


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    work = copy_checkout(tmp_path_factory.mktemp("checkout"))
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return work


def _copy(done: Path, dest: Path) -> Path:
    shutil.copytree(done, dest, symlinks=True)
    return dest


def test_every_step_of_the_run_is_kept(done):
    runs = history.runs(done / "results/local")
    assert len(runs) == 1
    kept = set(runs[0].files())
    assert {"bench/gelu.csv", "bench/cells/gelu__native.csv", "logs/bench_cell_gelu__native.log",
            "benchmarks/bench_cell_gelu__native.jsonl", "env/env.json"} <= kept


def test_a_target_copied_in_renders_with_a_plain_run(done, tmp_path):
    work = _copy(done, tmp_path / "foreign")
    shutil.copytree(work / "results/local", work / "results/evil", symlinks=True)  # cp -a: times kept
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert planned_jobs(proc) == {"report_render": 1, "all": 1}
    html = (work / "reports/report.html").read_text()
    assert "evil" in html and "baseline target <code>local</code>" in html


def test_a_target_copied_in_without_its_times_is_read_not_measured_again(done, tmp_path):
    """A plain copy (cp -r, scp, an unzip) gives every file a new time, often leaving a step's inputs newer than its
    outputs: the run must still only read that target, never re-measure it on this machine under its name."""
    work = _copy(done, tmp_path / "plain")
    copied = work / "results/evil"
    shutil.copytree(work / "results/local", copied, symlinks=True, copy_function=shutil.copy)
    later = time.time() + 5
    for upstream in ("env/env.json", "bench/ceilings.csv"):
        os.utime(copied / upstream, (later, later))
    before = {p: p.read_bytes() for p in copied.rglob("*") if p.is_file()}
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert planned_jobs(proc) == {"report_render": 1, "all": 1}
    assert {p: p.read_bytes() for p in copied.rglob("*") if p.is_file()} == before
    assert "evil" in (work / "reports/report.html").read_text()


def test_a_target_copied_in_is_not_measured_here_under_its_name(done, tmp_path):
    """Run again under the copied target's own name (--config target=...), a step that would measure it here stops
    with what to do instead: its rows would carry the fingerprint of the machine its env.json describes."""
    work = _copy(done, tmp_path / "renamed")
    copied = work / "results/h100"
    shutil.copytree(work / "results/local", copied, symlinks=True)
    env_json = copied / "env/env.json"
    times = env_json.stat()
    env = json.loads(env_json.read_text())
    env["device"].update(name="NVIDIA H100 80GB HBM3", backend="cuda")
    env_json.write_text(json.dumps(env))
    os.utime(env_json, ns=(times.st_atime_ns, times.st_mtime_ns))
    later = time.time() + 5
    os.utime(copied / "bench/ceilings.csv", (later, later))
    cell = copied / "bench/cells/gelu__native.csv"
    good = cell.read_bytes()
    proc = snakemake(work, "results/h100/bench/cells/gelu__native.csv", "--configfile", "config.yaml", "small.yaml",
                     "--config", "target=h100")
    assert proc.returncode != 0
    assert ("results/h100/env/env.json describes NVIDIA H100 80GB HBM3 (cuda), but this job runs on "
            in proc.stderr), proc.stderr[-3000:]
    assert cell.read_bytes() == good


def test_a_failed_re_measurement_keeps_the_last_good_table(done, tmp_path):
    work = _copy(done, tmp_path / "failed")
    triton = work / "results/local/bench/cells/gelu__triton.csv"
    good = triton.read_bytes()
    # An edit that makes the Triton cells' step exit without a traceback: their re-measurement fails.
    script = work / "workflow/scripts/bench_cell.py"
    line = "    op, impl = step.wildcards.op, step.wildcards.impl\n"
    failing = line + '    if impl == "triton":\n        raise SystemExit(3)\n'
    script.write_text(script.read_text().replace(line, failing))
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml")
    assert proc.returncode != 0
    assert (f"gpulab: results/local/bench/cells/gelu__triton.csv: its re-measurement failed; kept the last good "
            f"table (run {history.runs(done / 'results/local')[0].id}), marked stale") in proc.stderr
    assert triton.read_bytes() == good and triton.stat().st_mtime == history.STALE_MTIME
    # The report Snakemake could not render (its inputs failed) is rendered again, marking the table stale.
    assert "gpulab: reports/report.html rendered again: it marks the tables put back as stale" in proc.stderr
    html = (work / "reports/report.html").read_text()
    assert "are stale, older than their inputs" in html and "bench/cells/gelu__triton.csv" in html
    again = snakemake(work, "-n", "--configfile", "config.yaml", "small.yaml")
    assert "stale, the last good table of run" in again.stderr
    # Measured again through its params (the stamp of the put-back), nothing private of Snakemake's.
    assert planned_jobs(again).get("bench_cell", 0) >= 1
    assert "results/local/bench/cells/gelu__triton.csv" in planned_outputs(again)
    reasons = again.stdout + again.stderr
    assert "Params have changed since last execution" in reasons and "bench/cells/gelu__triton.csv@" in reasons
    listing = subprocess.run([sys.executable, "-m", "gpulab.cli", "history"], cwd=work, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(work / "src")}, timeout=120)
    assert "local: 2 run(s) kept" in listing.stdout and "stale:" in listing.stdout, listing.stdout


def test_a_killed_forced_measurement_is_measured_again_after_unlock(done, tmp_path):
    work = _copy(done, tmp_path / "killed")
    good = (work / CELL).read_bytes()
    env = {**os.environ, "GPULAB_CACHE_DIR": os.environ.get("GPULAB_CACHE_DIR", str(REPO / ".cache"))}
    run = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config.yaml",
                            "small.yaml", "--forcerun", CELL], cwd=work, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # Killed once Snakemake removed the table and marked it as being written (.snakemake/incomplete/).
    while ((work / CELL).exists() or CELL not in history.incomplete_outputs(work / ".snakemake")) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert not (work / CELL).exists()
    unlock = snakemake(work, "--unlock", "--configfile", "config.yaml", "small.yaml")
    assert f"gpulab: {CELL}: its re-measurement was interrupted; kept the last good table" in unlock.stderr
    assert (work / CELL).read_bytes() == good
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "config.yaml", "small.yaml"))
    # Every op's table reads every cell (one ceiling per pattern, dtype and size across them).
    assert planned.get("bench_cell") == 1 and planned.get("bench_aggregate") == len(SMALL["bench"]["ops"])


def default_sigint() -> None:
    """What a terminal's processes have; a test run started in the background inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_re_measurement_is_called_an_interrupt(done, tmp_path):
    """Ctrl-C while a forced measurement runs (SIGINT to Snakemake and its jobs, one process group): the log says
    interrupted, the last good table is back, and the next run measures it again."""
    work = _copy(done, tmp_path / "interrupted")
    good = (work / CELL).read_bytes()
    script = work / "workflow/scripts/bench_cell.py"
    line = "    op, impl = step.wildcards.op, step.wildcards.impl\n"
    script.write_text(script.read_text().replace(line, line + "    __import__('time').sleep(300)\n"))
    env = {**os.environ, "GPULAB_CACHE_DIR": os.environ.get("GPULAB_CACHE_DIR", str(REPO / ".cache"))}
    run = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", CELL, "--configfile", "config.yaml",
                            "small.yaml", "--forcerun", CELL], cwd=work, env=env, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    log = work / "results/local/logs/bench_cell_gelu__native.log"
    deadline = time.monotonic() + 120
    # Snakemake removes the table and the log before the job runs; the job's own log then says it started.
    while (work / CELL).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while not (log.is_file() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # into the step's own code
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=300)
    assert run.returncode != 0
    assert f"gpulab: {CELL}: its re-measurement was interrupted; kept the last good table" in err, err[-3000:]
    assert "gpulab: the run was interrupted (Ctrl-C or SIGINT); 1 step(s) did not finish" in err
    assert "re-measurement failed" not in err and "step(s) failed" not in err
    assert (work / CELL).read_bytes() == good
    assert history.restored(work / "results/local")["bench/cells/gelu__native.csv"]["why"] == history.INTERRUPTED
    assert CELL in planned_outputs(snakemake(work, "-n", "--configfile", "config.yaml", "small.yaml"))


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of 16 MiB (tmpfs), where this host lets the test mount one."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small filesystem needs root here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_render_on_a_full_disk_leaves_the_last_good_page(done, tmp_path, small_disk):
    work = _copy(done, tmp_path / "full")
    page = small_disk / "report.html"
    setting = ("--config", f"report={{output: {page}}}")
    first = snakemake(work, "--configfile", "config.yaml", "small.yaml", *setting)
    assert first.returncode == 0 and page.is_file(), first.stderr[-3000:]
    good = page.read_bytes()
    # The disk full, as a long run's traces leave it.
    full = pytest.raises(OSError, match="No space left on device")
    with open(small_disk / "filler", "wb", buffering=0) as filler, full:
        while True:
            filler.write(b"\0" * 2**16)
    proc = snakemake(work, "--configfile", "config.yaml", "small.yaml", *setting, "--forcerun", "report_render")
    assert proc.returncode != 0
    assert "No space left on device" in proc.stderr
    assert f"gpulab: {page}: its render did not complete; the last good page is back in place" in proc.stderr
    assert "step(s) failed (reasons from their logs)" in proc.stderr
    assert page.read_bytes() == good
    (small_disk / "filler").unlink()
    assert planned_jobs(snakemake(work, "-n", "--configfile", "config.yaml", "small.yaml", *setting)).get(
        "report_render") == 1
