"""History: tables that hold an earlier run's results (stale), and each cell's trend across a target's kept runs.

A table is stale where its last re-measurement failed or was interrupted and gpulab.core.history put the last good
copy back (older than its inputs, so the next run measures it again). The trend follows each cell of every
measured artifact through the runs that wrote that artifact (``results/<target>/history/``), oldest first, and
flags a step from one run to the next only where ``gpulab compare`` would (gpulab.report.compare.run_deltas).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.history import Run, runs
from gpulab.core.history import stale as stale_tables
from gpulab.report.compare import AMBIGUOUS, FLAGGED, run_deltas
from gpulab.report.results import is_measured, key_columns

ORDER = 12
ID = "history"
TITLE = "History of runs"
TEMPLATE = "history.html.j2"
# The most recent versions of an artifact a trend shows (each step between two is a bootstrap per cell).
MAX_VERSIONS = 6


def _label(run: Run) -> str:
    when = run.time.strftime("%m-%d %H:%M:%S") if run.time else run.id[:16]
    return f"{when} {run.commit}"


def _versions(ctx: Any, target_dir: Path, name: str, kept: list[Run]) -> list[tuple[Run, pd.DataFrame]]:
    found = []
    for run in kept:
        path = run.path / name
        if path.is_file():
            frame = ctx.results.read_csv(path, target_dir.name)
            if not frame.empty and is_measured(frame):
                found.append((run, frame))
    return found[-MAX_VERSIONS:]


def trend(ctx: Any, target_dir: Path, name: str, kept: list[Run]) -> dict[str, Any] | None:
    """One artifact's median time per cell and run, with the changes compare flags between consecutive runs."""
    versions = _versions(ctx, target_dir, name, kept)
    if len(versions) < 2:
        return None
    keys = [k for k in key_columns(versions[-1][1]) if k != "target"]
    wide = None
    changes: dict[tuple, list[str]] = {}
    for i, (run, frame) in enumerate(versions):
        column = frame.drop_duplicates(subset=keys).set_index(keys)["median_ms"].rename(_label(run))
        wide = column.to_frame() if wide is None else wide.join(column, how="outer")
        if i == 0:
            continue
        deltas = run_deltas(versions[i - 1][1], frame, keys=keys)
        for row in deltas[deltas["verdict"].isin((*FLAGGED, AMBIGUOUS))].to_dict("records"):
            change = f" {row['change_pct']:+.1f}%" if row["change_pct"] == row["change_pct"] else ""
            changes.setdefault(tuple(row[k] for k in keys), []).append(f"{_label(run)}: {row['verdict']}{change}")
    wide = wide[wide.notna().sum(axis=1) >= 2]
    if wide.empty:
        return None
    wide["changes"] = ["; ".join(changes.get(i if isinstance(i, tuple) else (i,), [])) for i in wide.index]
    flagged = wide[wide["changes"] != ""].reset_index()
    return {"name": name, "runs": [_label(r) for r, _ in versions], "cells": len(wide),
            "flagged": flagged, "all": wide.reset_index()}


def build(ctx: Any) -> dict[str, Any] | None:
    targets = []
    for target in ctx.results.targets:
        target_dir = ctx.results.root / target
        kept = runs(target_dir)
        stale = [{"table": rel, "why": why} for rel, why in stale_tables(target_dir).items()]
        names = sorted({name for run in kept for name in ctx.results.artifact_names()
                        if (run.path / name).is_file()})
        trends = [t for name in names if (t := trend(ctx, target_dir, name, kept)) is not None]
        if kept or stale:
            targets.append({"name": target, "runs": len(kept), "stale": pd.DataFrame(stale), "trends": trends,
                            "first": kept[0].id if kept else None, "last": kept[-1].id if kept else None})
    if not targets:
        return None
    return {"targets": targets, "stale_count": sum(len(t["stale"]) for t in targets)}
