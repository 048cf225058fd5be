"""One summary, at the end of a failed run, of every failing step and its reason.

Snakemake alone prints ``CalledProcessError ... check log file(s)`` per failed job; the reason (strict
mode's list of non-ok outcomes from ``outcomes_check``, a full disk, a bad size) is in the job's log. Steps
append to their logs (``gpulab.core.logs.to_log``), so the Snakefile notes each log's size when it is parsed
(:func:`log_offsets`) and, on error, reads only what the run added (:func:`failure_summary`): the exception
each failing step ended with. With the default profile's ``keep-going``, every independent step has run by
then, so one run reports every problem (in strict mode: every outcome that is not ok, across all steps, in the
judging step's one entry).

A step that ends without a Python traceback (``sys.exit``, ``os._exit``, a signal, an OOM kill) has its exit
recorded by the step runner (:data:`EXIT_RECORD`, gpulab.workflow.step). A job killed whole (its process group, by a
scheduler's limit) records nothing: Snakemake's own log of the run then says which jobs failed (their
``Error in rule`` blocks: outputs, logs, the executor's message, a Slurm job id), and where ``sacct`` is
installed the summary asks Slurm how the job ended.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TRACEBACK = "Traceback (most recent call last):"
# The line the step runner writes when the step's process ended with an error (gpulab.workflow.step.run_watched).
EXIT_RECORD = "gpulab: the step's process "
TAIL_LINES = 6
SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,Timelimit,MaxRSS,ReqMem"
# What Snakemake logs when Ctrl-C (SIGINT) stops a run; the steps it stopped did not fail.
INTERRUPT_MARK = "Terminating processes on user request"
INTERRUPTED = "interrupted (Ctrl-C or SIGINT) before it finished"


@dataclass
class FailedJob:
    """One ``Error in rule`` block of Snakemake's log of the run."""

    rule: str
    outputs: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    message: str = ""
    external_jobid: str = ""


_ANNOTATION = re.compile(r"\s+\([^)]*\)$")


def _paths(value: str) -> list[str]:
    return [_ANNOTATION.sub("", p.strip()) for p in value.split(", ") if p.strip()]


def _run_log(snakemake_log: str | Path | Sequence[str | Path] | None) -> str:
    logs = [snakemake_log] if isinstance(snakemake_log, (str, Path)) else list(snakemake_log or [])
    text = ""
    for path in logs:
        try:
            text += Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return text


def interrupted(snakemake_log: str | Path | Sequence[str | Path] | None) -> bool:
    """Whether Ctrl-C (SIGINT) stopped the run, by Snakemake's log of it."""
    return INTERRUPT_MARK in _run_log(snakemake_log)


def failed_jobs(snakemake_log: str | Path | Sequence[str | Path] | None) -> list[FailedJob]:
    """The failed jobs Snakemake's log(s) of this run list (``Error in rule ...:`` blocks)."""
    text = _run_log(snakemake_log)
    jobs = []
    for block in re.finditer(r"^Error in rule (\w+):\n((?:    \S.*\n?)*)", text, re.M):
        job = FailedJob(block[1])
        for key, value in re.findall(r"^    (\w+): (.*)$", block[2], re.M):
            if key == "output":
                job.outputs = _paths(value)
            elif key == "log":
                job.logs = _paths(value.replace(" (check log file(s) for error details)", ""))
            elif key == "message":
                job.message = value.strip()
            elif key == "external_jobid":
                job.external_jobid = value.strip()
        jobs.append(job)
    return jobs


def slurm_account(jobid: str) -> str:
    """How Slurm says a job ended (``sacct``), or what is known without it."""
    if not shutil.which("sacct"):
        return (f"Slurm job {jobid}: sacct is not installed on this host, so Slurm's account of it (state, exit "
                f"code, memory) is not available here; `sacct -j {jobid}` on a cluster login node shows it")
    try:
        out = subprocess.run(["sacct", "-j", jobid, "-n", "-P", "-o", SACCT_FIELDS], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"Slurm job {jobid}: sacct failed ({exc})"
    if not out:
        return f"Slurm job {jobid}: sacct knows no such job (accounting off, or purged)"
    names = SACCT_FIELDS.split(",")
    return "\n".join("Slurm " + ", ".join(f"{k}={v}" for k, v in zip(names, line.split("|"), strict=False) if v)
                     for line in out.splitlines())


def step_logs(results_dir: str | Path) -> list[Path]:
    root = Path(results_dir)
    return sorted([*root.glob("*/logs/*.log"), *root.glob("*.log")])


def log_offsets(results_dir: str | Path) -> dict[str, tuple[int, int]]:
    """(inode, size) of every step log now: what a later :func:`failure_summary` skips as earlier runs' output."""
    return {str(p): (st.st_ino, st.st_size) for p in step_logs(results_dir) for st in [p.stat()]}


def _new_part_start(path: Path, offsets: Mapping[str, tuple[int, int]]) -> int:
    """Where this run's output of a log starts: after the earlier content, or at 0 where Snakemake replaced the
    file (a job's log is removed with its outputs before a rerun)."""
    inode, size = offsets.get(str(path), (-1, 0))
    st = path.stat()
    return size if st.st_ino == inode and st.st_size >= size else 0


def final_error(text: str) -> str | None:
    """The exception (type, message and its continuation lines) of the last traceback in ``text``."""
    start = text.rfind(TRACEBACK)
    if start < 0:
        return None
    lines = text[start:].splitlines()[1:]
    for i, line in enumerate(lines):
        if line and not line[0].isspace():  # frames are indented; the exception line is not
            message = [line]
            for more in lines[i + 1:]:
                if not more.strip() or not more[0].isspace():
                    break
                message.append(more)
            return "\n".join(message)
    return None


def exit_records(text: str) -> list[str]:
    """The step runner's records of a process that ended with an error (:data:`EXIT_RECORD`)."""
    return [line[line.index(EXIT_RECORD):].removeprefix("gpulab: ") for line in text.splitlines()
            if EXIT_RECORD in line]


def tail(text: str, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of the log before the runner's exit record: what the step printed last."""
    kept = [line for line in text.splitlines() if line.strip() and EXIT_RECORD not in line]
    return kept[-lines:]


def _reason(text: str, stopped: bool = False) -> list[str]:
    """Why a step failed, from what its log gained in this run; ``stopped``: the run was interrupted."""
    error = final_error(text)
    exits = exit_records(text)
    if stopped and (error is None or error.startswith("KeyboardInterrupt")):
        last = tail(text[:text.find(TRACEBACK)] if TRACEBACK in text else text)  # what it printed, not where
        return [INTERRUPTED, *(["last lines of the log:", *(f"  {line}" for line in last)] if last else [])]
    if error and not (exits and error.startswith("SystemExit")):
        return error.splitlines()
    # The step's own last words: a SystemExit's place (gpulab.workflow.step), a native crash's (faulthandler).
    lines = [line for line in text.splitlines() if line.startswith(("SystemExit(", "Fatal Python error:"))]
    if exits:
        lines += exits[-1:]
    else:
        lines.append("no reason recorded in the log: the job was ended from outside (its whole process group "
                     "killed: a scheduler's time or memory limit, an OOM kill of the job, a kill by hand)")
    last = [line for line in tail(text) if line not in lines]
    return lines + (["last lines of the log:", *(f"  {line}" for line in last)] if last else [])


def _new_text(path: Path, offsets: Mapping[str, tuple[int, int]]) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.seek(_new_part_start(path, offsets))
        return fh.read()


def failure_summary(results_dir: str | Path, offsets: Mapping[str, tuple[int, int]],
                    snakemake_log: str | Path | Sequence[str | Path] | None = None) -> str | None:
    """Every step that failed during this run, with its reason; None when there is none.

    A step counts as failed where Snakemake's log of the run (``snakemake_log``) says so, or where its own log
    gained an error (a traceback or the runner's exit record) in this run.
    """
    jobs = failed_jobs(snakemake_log)
    stopped = interrupted(snakemake_log)
    by_log = {Path(log): job for job in jobs for log in job.logs}
    entries = []
    seen = set()
    for path in [*step_logs(results_dir), *by_log]:
        if path in seen:
            continue
        seen.add(path)
        job = by_log.get(path)
        text = _new_text(path, offsets) if path.is_file() else ""
        if job is None and final_error(text) is None and not exit_records(text):
            continue
        lines = (_reason(text, stopped) if text.strip()
                 else ["the job's log is empty: it ended before its script started"])
        if job is not None and job.message and "SLURM" in job.message:
            lines.append(job.message.split("For further error details")[0].strip())
        if job is not None and job.external_jobid:
            lines.extend(slurm_account(job.external_jobid).splitlines())
        entries.append(f"* {path}\n" + "\n".join(f"    {line}" for line in lines))
    for job in jobs:
        if not job.logs:
            entries.append(f"* rule {job.rule}: {job.message or 'failed'} (the rule has no log)")
    if not entries:
        return None
    if stopped:
        return (f"gpulab: the run was interrupted (Ctrl-C or SIGINT); {len(entries)} step(s) did not finish "
                "(from their logs):\n" + "\n".join(entries))
    return f"gpulab: {len(entries)} step(s) failed (reasons from their logs):\n" + "\n".join(entries)
