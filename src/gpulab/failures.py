"""One summary, at the end of a failed run, of every failing step and its reason.

Snakemake alone prints ``CalledProcessError ... check log file(s)`` per failed job; the reason (strict
mode's list of non-ok outcomes from ``outcomes_check``, a full disk, a bad size) is in the job's log. Steps
append to their logs (``gpulab.logs.to_log``), so the Snakefile notes each log's size when it is parsed
(:func:`log_offsets`) and, on error, reads only what the run added (:func:`failure_summary`): the exception
each failing step ended with. With the default profile's ``keep-going``, every independent step has run by
then, so one run reports every problem (in strict mode: every outcome that is not ok, across all steps, in the
judging step's one entry).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

TRACEBACK = "Traceback (most recent call last):"


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


def failure_summary(results_dir: str | Path, offsets: Mapping[str, tuple[int, int]]) -> str | None:
    """Every step log that ended in an error during this run, with that error; None when there is none."""
    entries = []
    for path in step_logs(results_dir):
        with open(path, encoding="utf-8", errors="replace") as fh:
            fh.seek(_new_part_start(path, offsets))
            error = final_error(fh.read())
        if error:
            entries.append(f"* {path}\n" + "\n".join(f"    {line}" for line in error.splitlines()))
    if not entries:
        return None
    return f"gpulab: {len(entries)} step(s) failed (reasons from their logs):\n" + "\n".join(entries)
