"""One CSV schema per artifact, outcome statuses and atomic writes.

Every artifact is a tidy table. Every row says what happened (``status`` and ``reason``), where
(``target``) and on what software/hardware (``fingerprint``, the id of ``env/env.json``). Measured rows
add the columns of :class:`gpulab.core.timing.Timing`, so each says how it was measured.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.timing import TIMING_COLUMNS

STATUSES = ("ok", "skipped", "failed", "incorrect", "oom")
# Columns that name a cell of a matrix, used to point at offending rows in messages.
IDENTIFYING_COLUMNS = ("item", "tool", "op", "impl", "dtype", "size", "variant", "model", "engine")


@dataclass(frozen=True)
class CellKey:
    """What defines the work of one cell of a measured artifact, for matching it in two runs."""

    names: tuple[str, ...]  # columns that name the cell: rows of two runs are paired on them
    settings: tuple[str, ...] = ()  # columns that define its work besides: paired rows differing in one do other work


# Per artifact (a glob relative to results/<target>/, the first match wins): its cells' keys.
CELLS = {
    "*/ceilings.csv": CellKey(("kind", "dtype", "size", "method")),
    "bench/*.csv": CellKey(("op", "impl", "dtype", "size")),
    "mlp/summary.csv": CellKey(("variant",), ("dim", "num_layers", "batch")),
    "llm/*.csv": CellKey(("model", "engine", "test"), ("dtype", "n_prompt", "n_gen")),
    "build/timing_pitfalls.csv": CellKey(("impl", "method", "dtype", "size")),
}


def cell_key(artifact: str) -> CellKey | None:
    """The declared cell key of an artifact (``mlp/summary.csv``); None for one not declared."""
    return next((key for pattern, key in CELLS.items() if fnmatch.fnmatchcase(artifact, pattern)), None)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # str | float | int | bool
    description: str = ""


COMMON_COLUMNS = (
    Column("target", "str", "machine class the row was measured on (results/<target>/)"),
    Column("fingerprint", "str", "id of the environment fingerprint in env/env.json"),
    Column("status", "str", "ok | skipped | failed | incorrect | oom"),
    Column("reason", "str", "why the status is not ok (empty when ok)"),
)

TIMING_KINDS = {
    "median_ms": "float",
    "p10_ms": "float",
    "p90_ms": "float",
    "mean_ms": "float",
    "min_ms": "float",
    "cv": "float",
    "reps": "int",
    "warmup_reps": "int",
    "first_call_ms": "float",
    "timer": "str",
    "cache_policy": "str",
    "stable": "bool",
    "times_ms": "str",
    "energy_j": "float",
    "power_w": "float",
    "energy_reason": "str",
    "rel_ci": "float",
    "stop_reason": "str",
    "flush_bytes": "int",
}
# Columns added after tables were first recorded: older tables read back with them empty.
LATER_COLUMNS = (
    "stable", "times_ms", "reference_method", "reference_gbps", "reference_times_ms", "energy_j", "power_w",
    "energy_reason", "gb_per_j", "ceiling_spread", "ceiling_method", "above_ceiling", "tflop_per_j", "j_per_token",
    "tok_per_j", "datasheet_gbps", "pct_of_datasheet", "rel_ci", "stop_reason", "flush_bytes", "host_load",
)
assert set(TIMING_KINDS) == set(TIMING_COLUMNS), "timing columns drifted from gpulab.core.timing.Timing"
MEASURE_COLUMNS = (
    *(Column(name, kind, "see gpulab.core.timing") for name, kind in TIMING_KINDS.items()),
    Column("host_load", "float", "share of the host's CPUs other processes kept busy while the job measured, "
           "0-1 (gpulab.core.cores)"),
)


class SchemaError(ValueError):
    """Rows do not match the artifact's declared columns."""


class StrictModeError(RuntimeError):
    """strict: true and some outcome was not ok (gpulab.workflow.outcomes)."""


@dataclass(frozen=True)
class TableSchema:
    """The declared columns of one artifact, in order, and where it lies under ``results/<target>/`` (a pattern
    whose ``{wildcards}`` :meth:`at` fills in). ``measured`` adds the timing columns."""

    name: str
    columns: tuple[Column, ...]
    measured: bool = False
    path: str = ""

    def at(self, **wildcards: str) -> str:
        """The table's path under ``results/<target>/`` with its wildcards filled in."""
        if not self.path:
            raise ValueError(f"the {self.name} table has no declared path")
        return self.path.format(**wildcards)

    @property
    def all_columns(self) -> tuple[Column, ...]:
        return COMMON_COLUMNS + self.columns + (MEASURE_COLUMNS if self.measured else ())

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.all_columns]

    def frame(self, rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
        """Build the table, refusing unknown columns; columns a row lacks are empty (NaN)."""
        rows = [dict(r) for r in rows]
        known = set(self.names)
        for i, row in enumerate(rows):
            extra = set(row) - known
            if extra:
                raise SchemaError(f"{self.name}: row {i} has undeclared column(s) {sorted(extra)}")
            missing = {"target", "fingerprint", "status"} - set(row)
            if missing:
                raise SchemaError(f"{self.name}: row {i} lacks required column(s) {sorted(missing)}")
            if row["status"] not in STATUSES:
                raise SchemaError(f"{self.name}: row {i} has status {row['status']!r}; expected one of {STATUSES}")
        df = pd.DataFrame(rows, columns=self.names)
        df["reason"] = df["reason"].astype("object").fillna("")
        for column in self.all_columns:
            # Nullable dtypes keep "3" an integer even when other rows leave the cell empty.
            if column.kind == "int":
                df[column.name] = pd.to_numeric(df[column.name], errors="raise").astype("Int64")
            elif column.kind == "bool":
                df[column.name] = df[column.name].astype("boolean")
        return df

    def write(self, rows: Iterable[Mapping[str, Any]], path: str | Path) -> pd.DataFrame:
        df = self.frame(rows)
        write_atomic(path, df.to_csv(index=False))
        return df

    def read(self, path: str | Path) -> pd.DataFrame:
        df = pd.read_csv(path, keep_default_na=True)
        for column in LATER_COLUMNS:
            if column in self.names and column not in df.columns:
                df[column] = pd.NA
        missing = [c for c in self.names if c not in df.columns]
        if missing:
            raise SchemaError(f"{path}: not a {self.name} table, missing column(s) {missing}")
        df["reason"] = df["reason"].astype("object").fillna("")
        return df


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write via a temporary file in the same directory, so a crash never leaves a partial artifact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(text, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if isinstance(text, bytes) else {"encoding": "utf-8"})) as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
