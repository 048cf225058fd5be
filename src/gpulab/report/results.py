"""Read what every target left under ``results/``: the report's only input.

Results may be copied in from other machines, half-finished, or from an older version of the
workflow, so every read is defensive: an unreadable file becomes a recorded problem that the summary
shows, never an exception that loses the whole page.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.ceilings import STATE_COLUMNS
from gpulab.core.history import HISTORY
from gpulab.core.tables import IDENTIFYING_COLUMNS, declared_columns, matches, table_columns
from gpulab.core.timing import TIMING_COLUMNS

# Columns that describe a row rather than identify or measure it.
METADATA_COLUMNS = ("target", "fingerprint", "status", "reason")
# Every row of every table the workflow writes names these (gpulab.core.tables.COMMON_COLUMNS); a table without
# them, or a row with one of them empty, was cut off or is not the workflow's. (Not the fingerprint: tables
# copied in from older versions of the workflow may lack it.)
REQUIRED_COLUMNS = ("target", "status")
# The project's identifying columns, plus the ones some artifacts use to name a row's kind (ceilings:
# copy | matmul; LLM: the llama-bench test pp512 | tg128 | ...), in the order a reader scans a cell.
KEY_COLUMNS = tuple(dict.fromkeys((*IDENTIFYING_COLUMNS, "kind", "test")))
# report.max_table_bytes' default: a table larger than this is not read.
MAX_TABLE_BYTES = 64 * 2**20
# Files besides the tables that steps write under results/<target>/ (one glob per path part), and whole
# folders of them: what the report may follow or link, never taken for a table.
OTHER_FILES = (
    "env/env.json", "build/*.log", "build/extension_manifest.json", "llm/*__*.json", "mlp/trace_*.json.gz",
    "mlp/stacks_*.txt", "benchmarks/*.jsonl",
)
OTHER_FOLDERS = (HISTORY, "logs", "env/raw", "llm/models", "device_waits")
NUMBER_KINDS = ("float", "int")
# The parts of env.json that are objects (gpulab.env.capture): one of another type is left out.
ENV_OBJECTS = ("device", "compilers", "cpu", "git", "os", "packages", "python", "smi", "tools")
# How many files of one target that are not its own are named one by one.
FOREIGN_SHOWN = 50
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


@dataclass(frozen=True)
class Problem:
    """A results file the report could not use, and why."""

    path: str
    message: str


@dataclass(frozen=True)
class ResultsIndex:
    """All targets found under a results directory, including ones copied in from other machines."""

    root: Path
    problems: list[Problem] = field(default_factory=list, compare=False, hash=False)
    max_table_bytes: int = MAX_TABLE_BYTES

    @property
    def targets(self) -> list[str]:
        """Directories holding a target's results: an environment capture or some step's table."""
        return [p.name for p in target_dirs(self.root)]

    def path(self, target: str, relpath: str) -> Path:
        return self.root / target / relpath

    def _problem(self, path: Path, message: str) -> None:
        self._record(Problem(self._display(path), message))

    def _record(self, problem: Problem) -> None:
        """Record a problem, once per file or cell: the first reason found for it is the one shown."""
        if all(p.path != problem.path for p in self.problems):
            self.problems.append(problem)

    def _display(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def env(self, target: str) -> dict[str, Any] | None:
        path = self.path(target, "env/env.json")
        data = self.read_bytes(path)
        if data is None:
            return None
        try:
            env = json.loads(data)
        except (ValueError, RecursionError) as exc:
            self._problem(path, f"unreadable environment capture: {exc}")
            return None
        if not isinstance(env, dict):
            self._problem(path, "environment capture is not a JSON object")
            return None
        wrong = [key for key in ENV_OBJECTS if key in env and not isinstance(env[key], dict)]
        if wrong:
            self._problem(path, f"not objects, not shown: {', '.join(wrong)}")
        return {k: v for k, v in env.items() if k not in wrong}

    def read_csv(self, path: Path, target: str | None = None) -> pd.DataFrame:
        """One CSV, or an empty frame (with the problem recorded) when it cannot be parsed.

        Rows are labelled with the directory they were found in: a target copied in under another
        name (``results/h100-run2``) is that name in every table and figure.
        """
        data = self.read_bytes(path)
        if data is None:
            return pd.DataFrame()
        if not data.strip():
            self._problem(path, "an empty file (not even a header), not used")
            return pd.DataFrame()
        kinds = self._kinds(path)
        try:  # number columns read as text first: "true" is not a number, though pandas would make it 1
            frame = pd.read_csv(io.BytesIO(data), dtype={c: str for c, k in kinds.items() if k in NUMBER_KINDS})
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._problem(path, f"unreadable table: {exc}".splitlines()[0])
            return pd.DataFrame()
        missing = [c for c in self._columns(path) if c not in frame.columns]
        if missing:
            self._problem(path, f"not used: the table lacks column(s) {', '.join(missing)}")
            return pd.DataFrame()
        if truncated := _truncation(data, frame):
            self._problem(path, f"truncated table, not used: {truncated}")
            return pd.DataFrame()
        if absent := [c for c in kinds if c not in frame.columns and c != "fingerprint"]:
            self._problem(path, f"an older or partial table: column(s) {_names(absent)} absent, shown as missing")
            frame = frame.reindex(columns=[*frame.columns, *absent])
        if bad := _numbers(frame, kinds):
            self._problem(path, f"cells that are not numbers shown as missing, in column(s) {_names(bad)}")
        if target is not None and not frame.empty:
            frame["target"] = target
        if "reason" in frame.columns:  # all-empty reasons read as a float column of NaN
            frame["reason"] = ["" if pd.isna(v) else str(v) for v in frame["reason"]]
        elif "status" in frame.columns:
            frame["reason"] = ""
        return frame

    def _artifact(self, path: Path) -> str:
        """``path`` relative to its target's directory (``bench/gelu.csv``); "" for one outside the root."""
        try:
            return path.relative_to(self.root).as_posix().split("/", 1)[1]
        except (ValueError, IndexError):
            return ""

    def _columns(self, path: Path) -> tuple[str, ...]:
        """The columns a table at ``path`` must have: its declared ones where it is one the workflow writes."""
        return table_columns(self._artifact(path)) or REQUIRED_COLUMNS

    def _kinds(self, path: Path) -> dict[str, str]:
        return declared_columns(self._artifact(path)) or {}

    def own_file(self, target: str, value: Any, *, under: str = "", cell: str = "") -> Path | None:
        """A path taken from a cell or env.json (``value``, relative to ``under`` in the target's directory) as a
        regular file of that directory; None when it is missing, and also (the refusal recorded against ``cell``)
        when it is absolute, climbs out with ``..``, is a symlink leaving the directory, or is not a regular file."""
        if not isinstance(value, str) or not value.strip():
            return None
        where = cell or f"{target}/{under}/{value}".replace("//", "/")
        if value.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", value):
            return self._refuse(where, value, "an absolute path")
        if ".." in Path(value.replace("\\", "/")).parts:
            return self._refuse(where, value, "a path climbing out with ..")
        base = self.root / target
        path = base / under / value
        try:
            real = path.resolve(strict=True)
            inside = real.is_relative_to(base.resolve(strict=True))
            mode = os.stat(real).st_mode
        except (OSError, RuntimeError, ValueError):
            return None
        if not inside:
            return self._refuse(where, value, f"a symlink leaving {target}/")
        if not stat.S_ISREG(mode):
            return self._refuse(where, value, f"{_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}")
        return path

    def _refuse(self, where: str, value: str, why: str) -> None:
        self._record(Problem(where, f"{value!r} is {why}; not read, not linked"))
        return None

    def own(self, path: Path, *, cell: str = "") -> Path | None:
        """A path the report built under a target (``results/<t>/llm/x.json``) if it is that target's own file."""
        try:
            target, relpath = path.relative_to(self.root).as_posix().split("/", 1)
        except ValueError:
            return self._refuse(cell or str(path), str(path), f"outside {self.root}")
        return self.own_file(target, relpath, cell=cell or self._display(path))

    def read_bytes(self, path: Path, limit: int | None = None) -> bytes | None:
        """A target's own regular file, whole; None (the problem recorded) for a missing one, one leaving its
        target, a FIFO, device or socket, or one larger than ``limit`` (default: the table limit). Opened without
        blocking or following a symlink, and checked again on the open file, so what is read is what was checked."""
        limit = self.max_table_bytes if limit is None else limit
        if self.own(path) is None:
            return None
        try:
            fd = os.open(path.resolve(), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self._problem(path, f"unreadable: {exc.strerror}")
            return None
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._problem(path, f"{_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}; skipped")
                return None
            if info.st_size > limit:
                self._problem(path, f"{_size(info.st_size)}, over the limit of {_size(limit)} "
                                    "(report.max_table_bytes); skipped")
                return None
            try:
                return fh.read(limit + 1)
            except OSError as exc:
                self._problem(path, f"unreadable: {exc.strerror}")
                return None

    def read_text(self, path: Path) -> str | None:
        """A target's own file as text (see :meth:`read_bytes`); None (recorded) when it is not UTF-8."""
        data = self.read_bytes(path)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self._problem(path, "not UTF-8 text; not shown")
            return None

    def table(self, relpath: str) -> pd.DataFrame:
        """One artifact (e.g. ``bench/gelu.csv``) of every target that has it, concatenated."""
        frames = [self.read_csv(p, t) for t in self.targets if (p := self.path(t, relpath)).is_file()]
        return _concat(frames)

    def tables(self, pattern: str) -> pd.DataFrame:
        """Every file matching a glob under each target (e.g. ``llm/*.csv``), concatenated.

        ``source`` names the file each row came from (relative to its target directory).
        """
        frames = []
        for target in self.targets:
            base = self.root / target
            for path in self._known(base, pattern):
                frame = self.read_csv(path, target)
                if not frame.empty:
                    frames.append(frame.assign(source=path.relative_to(base).as_posix()))
        return _concat(frames)

    def artifacts(self, target: str) -> Iterator[tuple[str, pd.DataFrame]]:
        """Every final table of a target that records outcomes (has a status column), by relative path.

        Final artifacts are ``<step>/<name>.csv``; files deeper down (``bench/cells/...``) are a step's
        intermediates, already contained in its final tables.
        """
        base = self.root / target
        for path in self._known(base, "*/*.csv"):
            frame = self.read_csv(path, target)
            if "status" in frame.columns:
                yield path.relative_to(base).as_posix(), frame

    def known(self, target: str, pattern: str) -> list[Path]:
        """A target's tables matching ``pattern`` (``llm/*.csv``) that the workflow writes, no other file."""
        return self._known(self.root / target, pattern)

    @staticmethod
    def _known(base: Path, pattern: str) -> list[Path]:
        """The files matching ``pattern`` under a target that are tables the workflow writes (not the temporary
        file of an atomic write in progress, nor any other file copied in)."""
        return [p for p in sorted(base.glob(pattern)) if not p.name.startswith(".")
                and table_columns(p.relative_to(base).as_posix()) is not None]

    def survey(self) -> None:
        """Record every entry under each target that is not one of its own files: a file that is no table the
        workflow writes, a FIFO, device or socket, a symlink leaving the target. Nothing is read."""
        for target in self.targets:
            base = self.root / target
            foreign = [(rel, why) for rel, why in _foreign_entries(base) if why]
            for rel, why in foreign[:FOREIGN_SHOWN]:
                self._problem(base / rel, why)
            if len(foreign) > FOREIGN_SHOWN:
                self._problem(base, f"{len(foreign) - FOREIGN_SHOWN} more files that are not gpulab tables")

    # Kept for sections written against the first version of the index.
    outcome_files = artifacts

    def artifact_names(self) -> list[str]:
        """Relative paths of outcome tables present for any target, in a stable order."""
        names = {name for t in self.targets for name, _ in self.artifacts(t)}
        return sorted(names)

    def benchmarks(self, target: str) -> list[dict[str, Any]]:
        """Snakemake's ``benchmark:`` records of a target's jobs (``benchmarks/*.jsonl``, one job each)."""
        records = []
        for path in sorted(self.path(target, "benchmarks").glob("*.jsonl")):
            text = self.read_text(path)
            if text is None:
                continue
            try:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            except (ValueError, RecursionError) as exc:
                self._problem(path, f"unreadable benchmark record: {exc}")
                continue
            records.extend({**row, "job": path.stem} for row in rows if isinstance(row, dict))
        return records

    def logs(self, target: str) -> list[Path]:
        log_dir = self.path(target, "logs")
        return [p for p in sorted(log_dir.rglob("*.log")) if self.own(p)] if log_dir.is_dir() else []

    def logs_for(self, target: str, artifact: str, rows: pd.DataFrame,
                 rule_outputs: Mapping[str, Sequence[str]]) -> list[Path]:
        """Log files of the jobs that wrote ``rows`` of ``artifact`` (``<step>/<name>.csv``).

        The writer is the job whose rule's outputs (``rule_outputs``, the workflow's patterns) filled with its
        recorded wildcards name the artifact. An aggregate's rows come from finer jobs of the same cells: the
        jobs behind its inputs whose wildcards extend the writer's and match the rows (the ``gfx1151`` rows of
        ``build/kernel_resources.csv`` -> ``kernels_compile_gfx1151``). A job's log is named as its benchmark
        record (``log_of`` and ``benchmark_of`` in common.smk).
        """
        records = self.benchmarks(target)
        outputs = {r["job"]: job_outputs(r, rule_outputs) for r in records}
        writers = [r for r in records if any(p.endswith(f"/{artifact}") for p in outputs[r["job"]])]
        inputs = {os.path.normpath(p) for r in writers for p in r.get("input_size_mb") or {}}
        finer = [r for r in records if outputs[r["job"]] & inputs and any(_refines(r, w, rows) for w in writers)]
        logs = self.path(target, "logs")
        return [p for p in (logs / f"{r['job']}.log" for r in finer or writers) if self.own(p)]


def target_dirs(root: Path) -> list[Path]:
    """The directories of ``root`` holding a target's results: an environment capture or some step's table."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and ((p / "env" / "env.json").is_file() or next(p.glob("*/*.csv"), None) is not None))


def foreign_files(root: str | Path, own: Sequence[str]) -> list[str]:
    """Every file of the targets under ``root`` that this invocation does not produce (copied in from other
    machines), their history aside: inputs of the report, so a target copied in or changed renders again."""
    files = []
    for target in target_dirs(Path(root)):
        if target.name in own:
            continue
        files += [p.as_posix() for p in sorted(target.rglob("*")) if p.is_file()
                  and p.relative_to(target).parts[0] != HISTORY and not p.name.startswith(".")]
    return files


def _names(columns: Sequence[str], shown: int = 8) -> str:
    more = f" and {len(columns) - shown} more" if len(columns) > shown else ""
    return ", ".join(columns[:shown]) + more


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def _foreign_entries(base: Path) -> Iterator[tuple[str, str]]:
    """Every entry under a target directory with why it is not the target's own file ("" when it is)."""
    for folder, dirs, files in os.walk(base, followlinks=False):
        rel_dir = Path(folder).relative_to(base).as_posix()
        own = rel_dir in OTHER_FOLDERS or rel_dir.startswith(tuple(f"{f}/" for f in OTHER_FOLDERS))
        for name in sorted(files + [d for d in dirs if (Path(folder) / d).is_symlink()]):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            yield rel, _foreign(base, rel, own)


def _foreign(base: Path, rel: str, own: bool = False) -> str:
    """Why the entry ``rel`` of a target directory is not one of its files, or "" (``own``: in a folder of its
    files, where only a FIFO, device, socket or a symlink leaving is foreign)."""
    path = base / rel
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            real = path.resolve(strict=True)
            if not real.is_relative_to(base.resolve(strict=True)):
                return f"a symlink leaving {base.name}/; not followed"
            info = os.stat(real)
    except (OSError, RuntimeError):
        return "a broken symlink; skipped"
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        return f"{_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}; skipped"
    if own or stat.S_ISDIR(info.st_mode) or Path(rel).name.startswith("."):
        return ""
    if table_columns(rel) is not None or any(matches(rel, p) for p in OTHER_FILES):
        return ""
    return "not a gpulab table; not read"


_WILDCARD = re.compile(r"\{(\w+)(?:,[^}]*)?\}")


def job_outputs(record: Mapping[str, Any], rule_outputs: Mapping[str, Sequence[str]]) -> set[str]:
    """The files one job wrote: its rule's output patterns with the job's wildcards filled in."""
    wildcards = record.get("wildcards") or {}
    paths = set()
    for pattern in rule_outputs.get(record.get("rule_name", ""), ()):
        try:
            paths.add(os.path.normpath(_WILDCARD.sub(lambda m: str(wildcards[m.group(1)]), pattern)))
        except KeyError:
            continue
    return paths


def _refines(job: Mapping[str, Any], writer: Mapping[str, Any], rows: pd.DataFrame) -> bool:
    """Whether ``job`` is one cell of ``writer``'s table that ``rows`` belong to: its wildcards are the
    writer's plus at least one column of the rows, with one row's values (a model fetch has the model but not
    the engine of an LLM table, so it is a prerequisite, not a cell)."""
    own, parent = job.get("wildcards") or {}, writer.get("wildcards") or {}
    extra = {k: str(v) for k, v in own.items() if k not in parent}
    if any(own.get(k) != v for k, v in parent.items()) or not extra or not set(extra) <= set(rows.columns):
        return False
    return bool((rows[list(extra)].astype(str) == pd.Series(extra)).all(axis=1).any())


def _truncation(data: bytes, frame: pd.DataFrame) -> str | None:
    """Why a CSV that parsed is still cut short, or None. The workflow writes whole files atomically, ending
    in a newline; a copy cut mid-row still parses, with the missing cells empty."""
    if not data.endswith(b"\n"):
        return "the file does not end with a complete line"
    empty = frame[list(REQUIRED_COLUMNS)].isna().any(axis=1)
    if empty.any():
        return f"row(s) {[int(i) + 2 for i in frame.index[empty][:5]]} lack {list(REQUIRED_COLUMNS)} (line numbers)"
    return None


def _numbers(frame: pd.DataFrame, kinds: Mapping[str, str]) -> list[str]:
    """Make the declared number columns numbers, in place; the columns where some cell was not one."""
    bad = []
    for column, kind in kinds.items():
        if kind not in NUMBER_KINDS or column not in frame.columns:
            continue
        numbers = pd.to_numeric(frame[column], errors="coerce")
        if (numbers.isna() & frame[column].notna()).any():
            bad.append(column)
        frame[column] = numbers
    return bad


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def key_columns(df: pd.DataFrame) -> list[str]:
    """Columns that identify a cell (op, impl, dtype, size...), in the project's order, then target.

    When those do not make rows unique (an artifact with its own kind of key, e.g. a kernel name),
    the remaining text columns that are not metadata or timing are added.
    """
    keys = [c for c in KEY_COLUMNS if c in df.columns]
    if "target" in df.columns:
        keys.append("target")
    if not keys or df.duplicated(subset=keys).any():
        # The GPU's state around a row (clocks, temperature) is a condition of the measurement, not its name,
        # and its regime a reading of it: as keys they would match no ceiling of one GPU run with the next's.
        skip = (set(keys) | set(METADATA_COLUMNS) | set(TIMING_COLUMNS) | {c.name for c in STATE_COLUMNS}
                | {"source", "regime"})
        extra = [c for c in df.columns if c not in skip and not pd.api.types.is_numeric_dtype(df[c])
                 and not pd.api.types.is_bool_dtype(df[c])]
        keys += extra
    return keys


def number(value: Any) -> float:
    """A table cell as a float: NaN for an empty cell or text (a failed row's cells are blank)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def is_measured(df: pd.DataFrame) -> bool:
    """Rows carry the timing columns of :func:`gpulab.core.timing.measure`."""
    return {"median_ms", "p10_ms", "p90_ms"}.issubset(df.columns)
