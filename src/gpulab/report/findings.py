"""What a reviewer must know before trusting a figure, computed from the result tables: rows above their
ceiling (benchmark, MLP and LLM rows alike), rows whose timing was not stable and why, and the verdict
(which implementation is fastest where, and how close it comes to its measured ceiling).

Every section and the summary read these from here, so the headline, the section alerts and the
methodology's statements count the same rows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import pandas as pd

from gpulab.core.ceilings import CEILINGS
from gpulab.core.patterns import PATTERNS
from gpulab.core.tables import IDENTIFYING_COLUMNS
from gpulab.core.timing import MAX_CV, MAX_MEAN_OVER_MEDIAN, MIN_STABLE_REPS
from gpulab.report.results import ResultsIndex

# The column holding a row's percentage of its measured ceiling (benchmark, MLP and LLM tables).
PCT_COLUMN = "pct_of_ceiling"
# Above this a percentage of a ceiling is flagged (a row that set its own ceiling can read 100.00000000000001).
ABOVE_PCT = 100 + 1e-6
PATTERN_WORDS = {name: p.finding for name, p in PATTERNS.items()}


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"].astype(str) == "ok"] if "status" in frame.columns else frame.iloc[0:0]


def _true(values: pd.Series) -> pd.Series:
    return values.astype(str).str.strip().str.lower().isin(("true", "1"))


def table_group(relpath: str) -> str:
    """The table a row is counted under: one per benchmark op and step, all LLM engines' files together."""
    return "llm/*.csv" if relpath.startswith("llm/") else relpath


def group_label(group: str) -> str:
    """A table as the headline names it: ``gelu benchmark``, ``LLM``, ``MLP``, ``ceilings``."""
    match = re.fullmatch(r"bench/(\w+)\.csv", group)
    if match:
        name = match.group(1)
        return "ceiling" if name == "ceilings" else f"{name} benchmark"
    if group == "llm/*.csv":
        return "LLM"
    if group == "mlp/summary.csv":
        return "MLP"
    return group


class Unit(NamedTuple):
    """How a quantity is shown on this page: its unit's name and the factor from the tables' unit."""

    name: str
    scale: float


def flop_unit(results: ResultsIndex) -> Unit:
    """One unit for every matmul rate on the page: GFLOP/s when no rate of any target (MLP rows, matmul
    ceilings) reaches 0.1 TFLOP/s, as on a CPU; else TFLOP/s."""
    tables = [results.table(name) for name in ("mlp/summary.csv", CEILINGS.path)]
    rates = [pd.to_numeric(t["tflops"], errors="coerce") for t in tables if "tflops" in t.columns]
    largest = max((float(r.max()) for r in rates if r.notna().any()), default=math.nan)
    return Unit("GFLOP/s", 1e3) if largest < 0.1 else Unit("TFLOP/s", 1.0)


def rated_tables(results: ResultsIndex, target: str) -> Iterator[tuple[str, pd.DataFrame]]:
    """Every outcome table of the target whose rows carry a percentage of a measured ceiling."""
    for relpath, frame in results.artifacts(target):
        if PCT_COLUMN in frame.columns:
            yield relpath, frame


def above_ceiling_mask(frame: pd.DataFrame) -> pd.Series:
    """ok rows above their ceiling. A benchmark row carries the step's verdict (``above_ceiling``: beyond the
    spread of both, after the ceiling was raised to any faster kernel within that spread, so every row it
    leaves above 100% is flagged); MLP and LLM rows, whose tables have no such column, are flagged by the
    same outcome: a percentage of their ceiling above 100."""
    ok = frame["status"].astype(str) == "ok"
    if "above_ceiling" in frame.columns:
        return ok & _true(frame["above_ceiling"])
    return ok & (pd.to_numeric(frame[PCT_COLUMN], errors="coerce") > ABOVE_PCT)


def _describe(row: pd.Series) -> str:
    keys = [c for c in (*IDENTIFYING_COLUMNS, "test") if c in row.index and pd.notna(row[c]) and str(row[c]) != ""]
    return " · ".join(str(row[c]) for c in keys)


def above_ceiling(results: ResultsIndex, target: str) -> pd.DataFrame:
    """One line per row above its ceiling: the table, the row, its percentage and the ceiling's method."""
    rows = []
    for relpath, frame in rated_tables(results, target):
        for _, row in frame[above_ceiling_mask(frame)].iterrows():
            method = row.get("ceiling_method") or row.get("ceiling_pattern") or row.get("ceiling_dtype") or ""
            rows.append({"target": target, "table": relpath, "row": _describe(row),
                         "% of ceiling": float(pd.to_numeric(row[PCT_COLUMN], errors="coerce")),
                         "ceiling": str(method) if pd.notna(method) else ""})
    return pd.DataFrame(rows, columns=["target", "table", "row", "% of ceiling", "ceiling"])


def above_ceiling_in(results: ResultsIndex, prefix: str) -> pd.DataFrame:
    """The rows above their ceiling of every target, in the tables whose path starts with ``prefix``."""
    found = [above_ceiling(results, t) for t in results.targets]
    rows = pd.concat(found, ignore_index=True)
    return rows[rows["table"].str.startswith(prefix)].reset_index(drop=True)


def _why_unstable(unstable: pd.DataFrame) -> str:
    """Which part of the stability rule the unstable rows break, in words with the figures."""
    reps = pd.to_numeric(unstable.get("reps"), errors="coerce")
    cv = pd.to_numeric(unstable.get("cv"), errors="coerce")
    ratio = pd.to_numeric(unstable.get("mean_ms"), errors="coerce") / pd.to_numeric(
        unstable.get("median_ms"), errors="coerce")
    few = reps < MIN_STABLE_REPS
    spread = (cv > MAX_CV) | (ratio > MAX_MEAN_OVER_MEDIAN)
    if few.all() and not spread.any():
        counts = ", ".join(str(int(r)) for r in sorted(reps.dropna().unique()))
        return (f"only because they have {counts} repetition{'s' if counts != '1' else ''}, fewer than the "
                f"rule's {MIN_STABLE_REPS}; their spread is within it")
    parts = []
    if spread.any():
        parts.append(f"median cv {cv[spread].median():.2f}")
    skewed = int((ratio > MAX_MEAN_OVER_MEDIAN).sum())
    if skewed:
        parts.append(f"{skewed} with mean/median above {MAX_MEAN_OVER_MEDIAN:.2f}")
    if few.any():
        parts.append(f"{int(few.sum())} with fewer than {MIN_STABLE_REPS} repetitions")
    return "; ".join(parts)


def _group_rank(group: str) -> tuple[int, str]:
    """Benchmarks first, then the MLP, the LLM, the ceilings and the rest."""
    rank = 0 if group.startswith("bench/") and group != CEILINGS.path else \
        {"mlp/summary.csv": 1, "llm/*.csv": 2, CEILINGS.path: 3}.get(group, 4)
    return rank, group


def instability(results: ResultsIndex, target: str) -> list[dict[str, Any]]:
    """Per table (LLM engines together): how many ok rows are not stable, of how many, and why."""
    groups: dict[str, list[pd.DataFrame]] = {}
    for relpath, frame in results.artifacts(target):
        if "stable" in frame.columns:
            groups.setdefault(table_group(relpath), []).append(_ok(frame))
    out = []
    for group, frames in sorted(groups.items(), key=lambda item: _group_rank(item[0])):
        ok = pd.concat(frames, ignore_index=True)
        measured = ok[pd.to_numeric(ok.get("reps"), errors="coerce").notna()] if "reps" in ok else ok
        # A row its step did not judge (an empty ``stable``, as older standalone tables have) is not called unstable.
        measured = measured[measured["stable"].astype(str).str.strip().str.lower().isin(("true", "false", "1", "0"))]
        unstable = measured[~_true(measured["stable"])]
        if unstable.empty:
            continue
        out.append({"table": group, "label": group_label(group), "unstable": len(unstable), "rows": len(measured),
                    "why": _why_unstable(unstable)})
    return out


def throttled_rows(results: ResultsIndex, target: str) -> int:
    """ok rows during which the GPU reported throttling (no CPU row can say yes)."""
    return sum(int(_ok(frame)["throttled"].astype(str).str.startswith("yes").sum())
               for _, frame in results.artifacts(target) if "throttled" in frame.columns)


# The verdict ---------------------------------------------------------------------------------------------


def _range(values: pd.Series) -> str:
    low, high = float(values.min()), float(values.max())
    return f"{low:.2g}×" if f"{low:.2g}" == f"{high:.2g}" else f"{low:.2g}–{high:.2g}×"


def op_verdict(frame: pd.DataFrame, op: str) -> dict[str, Any] | None:
    """Which implementation is fastest in how many (size, dtype) cells, the best share of the ceiling a
    fastest row reaches, and the implementation furthest behind with its speed as a multiple of the fastest."""
    ok = _ok(frame)
    ok = ok[pd.to_numeric(ok["median_ms"], errors="coerce") > 0]
    if ok.empty:
        return None
    cells = ["size", "dtype"]
    best = ok.loc[ok.groupby(cells)["median_ms"].idxmin()]
    wins = best["impl"].value_counts()
    pct = pd.to_numeric(best.get(PCT_COLUMN), errors="coerce") if PCT_COLUMN in best else pd.Series(dtype=float)
    top = best.loc[pct.idxmax()] if pct.notna().any() else None
    relative = ok.merge(best[[*cells, "median_ms"]].rename(columns={"median_ms": "best_ms"}), on=cells)
    relative = relative.assign(speed=relative["best_ms"] / relative["median_ms"])
    laggard = relative.groupby("impl")["speed"].median().idxmin() if relative["impl"].nunique() > 1 else None
    pattern = str(ok["pattern"].iloc[0]) if "pattern" in ok.columns else ""
    return {
        "op": op, "cells": len(best),
        "wins": [{"impl": impl, "cells": int(n)} for impl, n in wins.items()],
        "best_pct": float(pct.max()) if top is not None else math.nan,
        "best_at": _describe(top[["impl", "dtype", "size"]]) if top is not None else "",
        "ceiling": PATTERN_WORDS.get(pattern, pattern),
        "laggard": None if laggard is None else {
            "impl": laggard, "range": _range(relative.loc[relative["impl"] == laggard, "speed"])},
    }


def mlp_verdict(summary: pd.DataFrame) -> dict[str, Any] | None:
    ok = _ok(summary)
    ok = ok[pd.to_numeric(ok.get("median_ms"), errors="coerce") > 0] if "median_ms" in ok else ok.iloc[0:0]
    if ok.empty:
        return None
    row = ok.loc[pd.to_numeric(ok["median_ms"]).idxmin()]
    return {"variant": row["variant"], "ms": float(row["median_ms"]),
            "pct": float(pd.to_numeric(pd.Series([row.get(PCT_COLUMN)]), errors="coerce").iloc[0]),
            "dtype": row.get("ceiling_dtype", "")}


def llm_verdict(frame: pd.DataFrame) -> dict[str, Any] | None:
    """The fastest engine's decode (tg) of the largest model measured."""
    ok = _ok(frame)
    if ok.empty or "test" not in ok.columns:
        return None
    tg = ok[ok["test"].astype(str).str.match(r"tg\d+$")]
    if tg.empty:
        return None
    rank = tg["model_source"].map({"real": 0, "random": 1, "tiny": 2}).fillna(3) if "model_source" in tg else 0
    tg = tg[rank == rank.min()] if isinstance(rank, pd.Series) else tg
    row = tg.loc[pd.to_numeric(tg["tok_s"], errors="coerce").idxmax()]
    return {"engine": row["engine"], "model": row["model"], "tok_s": float(row["tok_s"]),
            "pct": float(pd.to_numeric(pd.Series([row.get(PCT_COLUMN)]), errors="coerce").iloc[0]),
            "ceiling": row.get("ceiling_pattern", "read")}


def verdict(results: ResultsIndex, target: str, ops: tuple[str, ...]) -> dict[str, Any]:
    """The verdict of one target, from its benchmark, MLP and LLM tables."""
    bench = []
    for op in ops:
        path = results.path(target, f"bench/{op}.csv")
        if path.is_file() and (found := op_verdict(results.read_csv(path, target), op)) is not None:
            bench.append(found)
    mlp_path = results.path(target, "mlp/summary.csv")
    llm = [results.read_csv(p, target) for p in sorted(results.path(target, "llm").glob("*.csv"))]
    llm_frame = pd.concat([f for f in llm if not f.empty], ignore_index=True) if any(not f.empty for f in llm) \
        else pd.DataFrame()
    return {"bench": bench, "mlp": mlp_verdict(results.read_csv(mlp_path, target)) if mlp_path.is_file() else None,
            "llm": llm_verdict(llm_frame)}
