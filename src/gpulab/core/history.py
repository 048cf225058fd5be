"""Every run's tables, kept: ``results/<target>/history/<time>__<commit>__<config digest>/<step>/...``.

A completed step copies its tables and log here (:func:`record`), so a re-measurement never replaces the only copy;
:func:`restore` puts the last good copy of a table a failed re-measurement left missing back, and its step's params
change (:func:`put_back_stamp`) so the next run measures it again. ``<target dir>@<run>`` (a prefix of the run's
name, or ``-1``, ``-2``...) names the tables after that run.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from base64 import urlsafe_b64decode
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulab.core import jobenv
from gpulab.core.schema import config_hash

HISTORY = "history"
RESTORED = "restored"
TIME_FORMAT = "%Y%m%dT%H%M%SZ"
SEPARATOR = "__"
# What is kept of a step: its tables, records and log (not traces or built libraries, which can be large).
KEPT_SUFFIXES = (".csv", ".json", ".jsonl", ".log")
# A restored table is dated here, older than any input, so Snakemake's modification-time rule measures it again.
STALE_MTIME = 0.0
# A put-back note once its table is measured again (:func:`put_back_stamp`).
DONE = ".done"


@dataclass(frozen=True)
class Run:
    """One run's copies under a target's history."""

    id: str
    path: Path

    @property
    def parts(self) -> list[str]:
        parts = self.id.split(SEPARATOR)
        return parts + [""] * (3 - len(parts))

    @property
    def time(self) -> datetime | None:
        try:
            return datetime.strptime(self.parts[0], TIME_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return None

    @property
    def commit(self) -> str:
        return self.parts[1]

    @property
    def config_digest(self) -> str:
        return self.parts[2]

    @property
    def steps(self) -> list[str]:
        """The jobs that completed in this run, by their logs' names."""
        logs = self.path / "logs"
        return sorted(p.stem for p in logs.glob("*.log")) if logs.is_dir() else []

    def files(self) -> list[str]:
        """Every kept file, relative to the run's directory (as it is to the target's)."""
        return sorted(p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file())


def commit_of(directory: str | Path) -> str:
    """The short commit of the checkout at ``directory``, ``+dirty`` with uncommitted edits; "nocommit" outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=7", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "nocommit"
    return commit + ("+dirty" if dirty else "")


def new_run_id(config: Mapping[str, Any], checkout: str | Path | None = None, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime(TIME_FORMAT)
    commit = commit_of(checkout) if checkout is not None else "nocommit"
    return SEPARATOR.join((stamp, commit, config_hash(config)))


def current_run_id(config: Mapping[str, Any]) -> str:
    """The invocation's run (from the Snakefile), else one for this job alone."""
    return jobenv.get("run_id") or new_run_id(config)


def history_dir(target_dir: str | Path) -> Path:
    return Path(target_dir) / HISTORY


def _rel(target_dir: Path, file: str | Path) -> str | None:
    try:
        return Path(file).resolve().relative_to(target_dir.resolve()).as_posix()
    except ValueError:
        return None


def record_job(target_dir: str | Path, run_id: str, job: str, outputs: Iterable[str | Path],
               inputs: Iterable[str | Path]) -> None:
    """Note which of the target's tables one job read and wrote (``history/<run>/jobs/<job>.json``): a table older
    than one of those inputs is stale (:func:`stale`)."""
    target_dir = Path(target_dir)
    rels = lambda paths: sorted({r for p in paths if (r := _rel(target_dir, p)) and not r.startswith(HISTORY)})  # noqa: E731
    path = history_dir(target_dir) / run_id / "jobs" / f"{job}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"outputs": rels(outputs), "inputs": rels(inputs)}) + "\n")


def stale(target_dir: str | Path) -> dict[str, str]:
    """The target's tables that are older than their inputs, each with why: put back after a failed or
    interrupted re-measurement (:func:`restored`), or older than a table its job read (a cell measured again
    after its aggregate)."""
    target_dir = Path(target_dir)
    found = {rel: f"the last good table of run {note['run']}: {note['why']}"
             for rel, note in restored(target_dir).items()}
    latest: dict[str, list[str]] = {}
    for run in runs(target_dir):
        for job in sorted((run.path / "jobs").glob("*.json")):
            note = _note(job)
            if not isinstance(note, dict):
                continue
            latest.update({out: note.get("inputs", []) for out in note.get("outputs", [])})
    for rel, inputs in latest.items():
        table = target_dir / rel
        if rel in found or not table.is_file():
            continue
        newer = [i for i in inputs if (target_dir / i).is_file()
                 and (target_dir / i).stat().st_mtime > table.stat().st_mtime]
        if newer:
            found[rel] = f"older than its input {newer[0]}" + (f" and {len(newer) - 1} more" if len(newer) > 1 else "")
    return found


def record(target_dir: str | Path, run_id: str, files: Iterable[str | Path]) -> list[Path]:
    """Copy ``files`` (under ``target_dir``; tables, records and logs: :data:`KEPT_SUFFIXES`) into the run's
    history; returns the copies. A table written again in the same run replaces its copy."""
    target_dir = Path(target_dir)
    copies = []
    for file in map(Path, files):
        if not file.is_file() or file.suffix not in KEPT_SUFFIXES:
            continue
        try:
            rel = file.resolve().relative_to(target_dir.resolve())
        except ValueError:
            continue  # not a file of this target
        if rel.parts[0] == HISTORY:
            continue
        copy = history_dir(target_dir) / run_id / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_name(f".{copy.name}.tmp")
        shutil.copy2(file, tmp)
        os.replace(tmp, copy)
        copies.append(copy)
    clear_restored(target_dir, files)
    return copies


def _note(path: Path) -> Any:
    """A small JSON note of the history, or None: one that is no regular file (a FIFO copied in), over 1 MiB or
    not JSON is never waited on nor read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 2**20:
            return None
        try:
            return json.loads(fh.read())
        except (OSError, ValueError, RecursionError):
            return None


def runs(target_dir: str | Path) -> list[Run]:
    """The target's runs, oldest first (their names start with the time)."""
    root = history_dir(target_dir)
    if not root.is_dir():
        return []
    return [Run(p.name, p) for p in sorted(root.iterdir()) if p.is_dir() and p.name != RESTORED
            and not p.name.startswith(".")]


def find_run(target_dir: str | Path, spec: str) -> Run:
    """A run by its name, a unique prefix of it, or ``-1`` (the latest), ``-2``..."""
    known = runs(target_dir)
    if not known:
        raise LookupError(f"{target_dir}: no runs recorded under {history_dir(target_dir)}")
    if spec.lstrip("-").isdigit() and spec.startswith("-"):
        index = int(spec)
        if -len(known) <= index < 0:
            return known[index]
        raise LookupError(f"{target_dir}: run {spec} asked for, {len(known)} recorded")
    matches = [r for r in known if r.id == spec] or [r for r in known if r.id.startswith(spec)]
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(r.id for r in (matches or known)[-5:])
    what = "is ambiguous" if matches else "matches no run"
    raise LookupError(f"{target_dir}: {spec!r} {what}; runs: {names}")


def last_copy(target_dir: str | Path, rel: str, before: Run | None = None) -> tuple[Run, Path] | None:
    """The latest kept copy of ``rel`` (relative to the target), up to and including run ``before``."""
    for run in reversed(runs(target_dir)):
        if before is not None and run.id > before.id:
            continue
        if (run.path / rel).is_file():
            return run, run.path / rel
    return None


def state_at(target_dir: str | Path, run: Run, into: str | Path) -> Path:
    """A results directory holding the target's tables as they stood after ``run``: each file's latest copy up to
    that run, hard-linked, else copied (``into/<target>/...``), so each is the target's own file there, as the
    report requires. A symlink kept in a run (none is written there) is left out. Returns ``into``."""
    target_dir = Path(target_dir)
    dest = Path(into) / target_dir.name
    for earlier in runs(target_dir):
        if earlier.id > run.id:
            break
        for rel in earlier.files():
            kept, link = earlier.path / rel, dest / rel
            if kept.is_symlink():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            try:
                os.link(kept, link, follow_symlinks=False)
            except OSError:
                shutil.copyfile(kept, link)
    return Path(into)


def resolve_results(spec: str) -> tuple[Path, str | None]:
    """``RESULTS`` as given, or for ``<target dir>@<run>`` and ``<target dir>/history/<run>`` a temporary results
    directory with that run's state (:func:`state_at`); the second value names the run."""
    path = Path(spec)
    if "@" in spec:
        where, _, which = spec.rpartition("@")
        target_dir = Path(where)
    elif path.parent.name == HISTORY:
        target_dir, which = path.parent.parent, path.name
    else:
        return path, None
    if not target_dir.is_dir():
        raise LookupError(f"{target_dir}: no such target directory")
    run = find_run(target_dir, which)
    return state_at(target_dir, run, tempfile.mkdtemp(prefix="gpulab-run-")), f"{target_dir.name}@{run.id}"


# ------------------------------------------------------------------------------ failed or interrupted runs


def restore(target_dir: str | Path, rel: str, why: str) -> Run | None:
    """Put the last kept copy of a missing table back, dated :data:`STALE_MTIME`, and note ``why`` beside it;
    None when no copy is kept (or the table is there). On a full disk the copy is a hard link (it takes no space);
    an OSError leaves the table missing, which measures it again too."""
    target_dir = Path(target_dir)
    path = target_dir / rel
    found = None if path.exists() else last_copy(target_dir, rel)
    if found is None:
        return None
    run, copy = found
    # The note first: its stamp (:func:`put_back_stamp`) is what makes the next run measure the table again.
    note = _note_path(target_dir, rel)
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"table": rel, "run": run.id, "why": why,
                                "restored_at": datetime.now(UTC).strftime(TIME_FORMAT)}) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.restore.tmp")
    try:
        _copy_or_link(copy, tmp)
        os.utime(tmp, (STALE_MTIME, STALE_MTIME))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return run


def _copy_or_link(source: Path, dest: Path) -> None:
    dest.unlink(missing_ok=True)
    try:
        shutil.copy2(source, dest)
    except OSError:
        dest.unlink(missing_ok=True)
        os.link(source, dest)


def _note_path(target_dir: Path, rel: str) -> Path:
    return history_dir(target_dir) / RESTORED / f"{rel}.json"


def put_back_stamp(results_dir: str | Path, outputs: Iterable[str | Path]) -> str:
    """A ``params:`` value of every step whose tables may be put back: it changes each time one is put back and
    stays after it is measured again, so Snakemake's params trigger measures a put-back table once more (its
    recorded checksums and params would otherwise call it up to date)."""
    stamps = []
    for output in outputs:
        where = split_target(results_dir, output)
        if where is None:
            continue
        note = _note_path(*where)
        for kept in (note, note.with_name(note.name + DONE)):
            try:
                stamps.append(f"{where[1]}@{kept.stat().st_mtime_ns}")
                break
            except OSError:
                continue
    return " ".join(stamps)


def restored(target_dir: str | Path) -> dict[str, dict[str, str]]:
    """The target's tables that hold an earlier run's results, put back after a re-measurement failed or was
    interrupted, by relative path: ``{"run": ..., "why": ...}``."""
    root = history_dir(target_dir) / RESTORED
    notes = {}
    for path in sorted(root.rglob("*.json")) if root.is_dir() else []:
        note = _note(path)
        if isinstance(note, dict) and (Path(target_dir) / str(note.get("table"))).is_file():
            notes[str(note["table"])] = note
    return notes


def clear_restored(target_dir: str | Path, files: Iterable[str | Path]) -> None:
    target_dir = Path(target_dir).resolve()
    for file in map(Path, files):
        try:
            rel = file.resolve().relative_to(target_dir)
        except ValueError:
            continue
        note = _note_path(target_dir, rel.as_posix())
        try:  # kept aside, not removed: its stamp must stay what the re-measurement ran with
            os.replace(note, note.with_name(note.name + DONE))
        except FileNotFoundError:
            continue


def split_target(results_dir: str | Path, path: str | Path) -> tuple[Path, str] | None:
    """``results/<target>/<rel>`` as (target dir, rel); None for a file outside any target."""
    try:
        rel = Path(os.path.relpath(path, results_dir))
    except ValueError:
        return None
    if rel.parts[0] in ("..", HISTORY) or len(rel.parts) < 2 or rel.parts[1] == HISTORY:
        return None
    return Path(results_dir) / rel.parts[0], Path(*rel.parts[1:]).as_posix()


def incomplete_outputs(metadata_dir: str | Path = ".snakemake") -> list[str]:
    """Files Snakemake marked as being written by a job that never finished (its run was killed): the names in
    ``.snakemake/incomplete/`` (Snakemake's file-based store: each is a path in URL-safe base64)."""
    root = Path(metadata_dir) / "incomplete"
    paths = []
    for marker in root.iterdir() if root.is_dir() else []:
        if not marker.is_file() or marker.name.startswith(("migration_underway", "@")):
            continue
        try:
            paths.append(urlsafe_b64decode(marker.name.encode()).decode())
        except ValueError:
            continue
    return sorted(paths)


def restore_interrupted(results_dir: str | Path, metadata_dir: str | Path = ".snakemake") -> list[str]:
    """Where a killed run left a table being re-measured missing, put its last good copy back (Snakemake then
    measures it again: the profile's rerun-incomplete); one line per table, for the user."""
    lines = []
    for path in incomplete_outputs(metadata_dir):
        if split_target(results_dir, path) is not None and not Path(path).exists():
            lines.append(put_back(results_dir, path, INTERRUPTED, "this run") or (
                f"{path}: its measurement was interrupted and no earlier copy is kept; if no job of this run "
                f"writes it, measure it again with: snakemake --cores 1 --forcerun {path}"))
    return lines


INTERRUPTED = "its re-measurement was interrupted"
FAILED = "its re-measurement failed"


def put_back(results_dir: str | Path, path: str, why: str, measures: str = "the next run") -> str | None:
    """Put one missing table of a target back (:func:`restore`); the line that tells the user, None where no copy
    is kept. Never raises: a table that cannot be put back is said so and stays missing."""
    where = split_target(results_dir, path)
    if where is None:
        return None
    try:
        run = restore(*where, why)
    except OSError as exc:
        return (f"{path}: {why}; its last good table could not be put back ({exc}); it is kept under "
                f"{history_dir(where[0])}/ and {measures} measures it again")
    if run is None:
        return None
    return f"{path}: {why}; kept the last good table (run {run.id}), marked stale; {measures} measures it again"


def restore_failed(results_dir: str | Path, outputs: Iterable[str], why: str = FAILED) -> list[str]:
    """After a failed or interrupted run: every output of a failed job that is gone (Snakemake removed it) and has
    a kept copy is put back, marked for the next run to measure again (:func:`put_back_stamp`). One line per
    table; never raises."""
    return [line for path in outputs if (line := put_back(results_dir, path, why))]


def stale_notice(results_dir: str | Path, targets: Iterable[str]) -> list[str]:
    """Tables that hold an earlier run's results after a failed or interrupted re-measurement, one line each."""
    return [f"{Path(results_dir) / target / rel}: stale, the last good table of run {note['run']} ({note['why']}); "
            "this run measures it again"
            for target in targets for rel, note in restored(Path(results_dir) / target).items()]


def record_benchmarks(results_dir: str | Path, run_id: str, since: float) -> None:
    """Snakemake writes a job's benchmark record after the job: at the end of the run, keep each written since
    ``since`` (the run's start) beside the tables of its run."""
    for target_dir in sorted(p for p in Path(results_dir).iterdir() if p.is_dir()) if Path(results_dir).is_dir() \
            else []:
        fresh = [p for p in (target_dir / "benchmarks").glob("*.jsonl") if p.stat().st_mtime >= since]
        if fresh and (history_dir(target_dir) / run_id).is_dir():
            record(target_dir, run_id, fresh)
