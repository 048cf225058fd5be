"""Every failure says why: a step that ends without a Python traceback (SystemExit, os._exit, SIGKILL, SIGSEGV)
has its exit recorded in its log by the step runner, and the failure summary of a real Snakemake run shows it;
a job that left nothing in its log is still listed, with what Snakemake and (where installed) sacct know."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulab.workflow.failures import EXIT_RECORD, failed_jobs, failure_summary, slurm_account
from gpulab.workflow.step import describe_exit, run_watched

REPO = Path(__file__).resolve().parent.parent

# How each step ends, and what its log and the summary must then say.
ENDINGS = {
    "sysexit": ("raise SystemExit(3)", "exited with code 3", "SystemExit(3) raised at"),
    "os_exit": ("os._exit(4)", "exited with code 4", None),
    "sigkill": ("os.kill(os.getpid(), signal.SIGKILL)", "was killed by SIGKILL (signal 9)", None),
    "segfault": ("ctypes.string_at(0)", "was killed by SIGSEGV (signal 11)", "Fatal Python error: Segmentation fault"),
    "exception": ("raise ValueError('bad size 7')", "exited with code 1", "ValueError: bad size 7"),
}


def _body(code: str):
    def body() -> None:
        import ctypes

        print("measuring...", flush=True)
        exec(code, {"os": os, "signal": signal, "ctypes": ctypes})
    return body


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_the_runner_records_how_the_step_ended(name, tmp_path, capfd):
    code, expected, _ = ENDINGS[name]
    status = run_watched(_body(code))
    out = capfd.readouterr().out
    assert status != 0
    assert f"{EXIT_RECORD}{expected}" in out, out


def test_a_step_that_succeeds_records_nothing(capfd):
    assert run_watched(lambda: print("fine")) == 0
    assert EXIT_RECORD not in capfd.readouterr().out


def test_an_oom_kill_is_named_where_the_cgroup_counted_one():
    text = describe_exit(-signal.SIGKILL, 0, 1)
    assert "OOM killer" in text and "oom_kill 0 -> 1" in text
    assert "no OOM kill" in describe_exit(-signal.SIGKILL, 2, 2)


SNAKEFILE = """
import sys
sys.path.insert(0, {src!r})
from gpulab.workflow.failures import failure_summary, log_offsets

OFFSETS = log_offsets("results")

rule all:
    input: expand("results/local/out/{{name}}.txt", name={names!r})

rule step:
    output: "results/local/out/{{name}}.txt"
    log: "results/local/logs/step_{{name}}.log"
    script: "step.py"

onerror:
    print(failure_summary("results", OFFSETS, log), file=sys.stderr)
"""

SCRIPT = """
import ctypes, os, signal
from gpulab.workflow.step import run

ENDINGS = {endings!r}

def main(step):
    print("measuring", step.wildcards.name, flush=True)
    code = ENDINGS[step.wildcards.name]
    if code:
        exec(code)
    open(step.output[0], "w").write("ok\\n")

run(snakemake, main)
"""


def test_a_snakemake_run_summarises_every_ending(tmp_path):
    endings = {name: code for name, (code, _, _) in ENDINGS.items()}
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(src=str(REPO / "src"), names=[*endings, "fine"]))
    (tmp_path / "step.py").write_text(textwrap.dedent(SCRIPT.format(endings={**endings, "fine": ""})))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--keep-going"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode != 0
    summary = proc.stderr[proc.stderr.index("step(s) failed"):]
    assert summary.startswith("step(s) failed (reasons from their logs):"), summary
    assert f"gpulab: {len(ENDINGS)} step(s) failed" in proc.stderr
    for name, (_, expected, detail) in ENDINGS.items():
        entry = summary.split(f"step_{name}.log", 1)[1].split("\n* ", 1)[0]
        assert expected in entry or (name == "exception" and detail in entry), (name, entry)
        if detail:
            assert detail in entry, (name, entry)
        if name not in ("exception", "segfault"):  # a segfault's last lines are its Python stack
            assert "measuring " + name in entry, (name, entry)  # the log's last lines
    assert "step_fine.log" not in summary


# What the Slurm executor appends to its message (snakemake_interface_executor_plugins RemoteExecutor).
FURTHER = "For further error details see the cluster/cloud log and the log files of the involved rule(s)."


def test_a_job_killed_whole_is_listed_with_what_is_known(tmp_path):
    """A job whose process group was killed (a scheduler's limit) wrote no record; Snakemake's error block (here as
    the Slurm executor writes it) names it, and without sacct the summary says so."""
    log = tmp_path / "results" / "local" / "logs" / "bench_cell_gelu__native.log"
    log.parent.mkdir(parents=True)
    log.write_text("2026-11-25 12:00:00,000 INFO gpulab.workflow.step: job of rule bench_cell started\n")
    run_log = tmp_path / "run.log"
    run_log.write_text(textwrap.dedent(f"""\
        Error in rule bench_cell:
            message: SLURM-job '4242' failed, SLURM status is: 'OUT_OF_MEMORY'. {FURTHER}
            jobid: 7
            input: results/local/env/env.json
            output: results/local/bench/cells/gelu__native.csv
            log: {log} (check log file(s) for error details)
            external_jobid: 4242
        """))
    jobs = failed_jobs(run_log)
    assert [(j.rule, j.outputs, j.external_jobid) for j in jobs] == [
        ("bench_cell", ["results/local/bench/cells/gelu__native.csv"], "4242")]
    summary = failure_summary(tmp_path / "results", {}, [str(run_log)])
    assert "no reason recorded in the log: the job was ended from outside" in summary
    assert "SLURM status is: 'OUT_OF_MEMORY'" in summary
    assert "job of rule bench_cell started" in summary
    if shutil.which("sacct") is None:
        assert "sacct is not installed on this host" in summary
        assert slurm_account("4242").startswith("Slurm job 4242: sacct is not installed")


def test_an_interrupted_run_is_called_an_interrupt(tmp_path):
    """Ctrl-C in the terminal: SIGINT to Snakemake and its jobs at once (one process group). The summary says the
    run was interrupted, and the step that was measuring did not finish: it did not fail."""
    import time

    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(src=str(REPO / "src"), names=["slow"]))
    (tmp_path / "step.py").write_text(textwrap.dedent(SCRIPT.format(endings={"slow": "import time; time.sleep(120)"})))
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                            # A terminal's processes take SIGINT; a test run in the background inherits it ignored.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = tmp_path / "results/local/logs/step_slow.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "measuring slow" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "gpulab: the run was interrupted (Ctrl-C or SIGINT); 1 step(s) did not finish" in err, err[-3000:]
    entry = err[err.index("the run was interrupted"):]
    assert "interrupted (Ctrl-C or SIGINT) before it finished" in entry and "measuring slow" in entry, entry
    assert "step(s) failed" not in err
