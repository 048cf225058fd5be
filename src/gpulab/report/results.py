"""Read what every target left under ``results/``: the report's only input.

Results may be copied in from other machines, half-finished, or from an older version of the
workflow, so every read is defensive: an unreadable file becomes a recorded problem that the summary
shows, never an exception that loses the whole page.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.ceilings import STATE_COLUMNS
from gpulab.core.history import HISTORY
from gpulab.core.tables import IDENTIFYING_COLUMNS
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

    @property
    def targets(self) -> list[str]:
        """Directories holding a target's results: an environment capture or some step's table."""
        return [p.name for p in target_dirs(self.root)]

    def path(self, target: str, relpath: str) -> Path:
        return self.root / target / relpath

    def _problem(self, path: Path, message: str) -> None:
        problem = Problem(self._display(path), message)
        if problem not in self.problems:
            self.problems.append(problem)

    def _display(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def env(self, target: str) -> dict[str, Any] | None:
        path = self.path(target, "env/env.json")
        if not path.exists():
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                env = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            self._problem(path, f"unreadable environment capture: {exc}")
            return None
        if not isinstance(env, dict):
            self._problem(path, "environment capture is not a JSON object")
            return None
        return env

    def read_csv(self, path: Path, target: str | None = None) -> pd.DataFrame:
        """One CSV, or an empty frame (with the problem recorded) when it cannot be parsed.

        Rows are labelled with the directory they were found in: a target copied in under another
        name (``results/h100-run2``) is that name in every table and figure.
        """
        try:
            frame = pd.read_csv(path)
            truncated = _truncation(path, frame)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()
        except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            self._problem(path, f"unreadable table: {exc}".splitlines()[0])
            return pd.DataFrame()
        if truncated:
            self._problem(path, f"truncated table, not used: {truncated}")
            return pd.DataFrame()
        if target is not None and not frame.empty:
            frame["target"] = target
        if "reason" in frame.columns:  # all-empty reasons read as a float column of NaN
            frame["reason"] = ["" if pd.isna(v) else str(v) for v in frame["reason"]]
        elif "status" in frame.columns:
            frame["reason"] = ""
        return frame

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
            for path in sorted(base.glob(pattern)):
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
        for path in sorted(base.glob("*/*.csv")):
            if path.name.startswith("."):
                continue  # temporary file of an atomic write in progress
            frame = self.read_csv(path, target)
            if "status" in frame.columns:
                yield path.relative_to(base).as_posix(), frame

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
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
                rows = [json.loads(line) for line in lines if line.strip()]
            except (OSError, json.JSONDecodeError) as exc:
                self._problem(path, f"unreadable benchmark record: {exc}")
                continue
            records.extend({**row, "job": path.stem} for row in rows if isinstance(row, dict))
        return records

    def logs(self, target: str) -> list[Path]:
        log_dir = self.path(target, "logs")
        return sorted(log_dir.rglob("*.log")) if log_dir.is_dir() else []

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
        return [p for p in (logs / f"{r['job']}.log" for r in finer or writers) if p.is_file()]


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


def _truncation(path: Path, frame: pd.DataFrame) -> str | None:
    """Why a CSV that parsed is still cut short, or None. The workflow writes whole files atomically, ending
    in a newline; a copy cut mid-row still parses, with the missing cells empty."""
    with open(path, "rb") as fh:
        fh.seek(-1, 2)
        if fh.read(1) != b"\n":
            return "the file does not end with a complete line"
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        return f"missing column(s) {missing}"
    empty = frame[list(REQUIRED_COLUMNS)].isna().any(axis=1)
    if empty.any():
        return f"row(s) {[int(i) + 2 for i in frame.index[empty][:5]]} lack {list(REQUIRED_COLUMNS)} (line numbers)"
    return None


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
