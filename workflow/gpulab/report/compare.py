"""Comparisons: the same cell on two targets (ratios) and on two runs (deltas against the measured spread).

A cell is one row of an artifact identified by its key columns (op, impl, dtype, size...). Across
targets the question is "how many times faster is this machine"; across runs it is "did this change by
more than the run-to-run noise we measured", which every measured row answers with its p10/p90 (or
coefficient of variation) columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpulab.report.results import METADATA_COLUMNS, key_columns

# Throughput columns, best first: where an artifact has one, targets are compared on it (higher is
# better) so cells at different problem sizes (sizes scale with each device) still compare.
THROUGHPUT_COLUMNS = ("tok_s", "gbps", "tflops", "gflops")
SIZE_COLUMN = "size"
# Numeric magnitude of a size, when "size" itself is a shape string.
SIZE_ORDER_COLUMNS = ("numel", "tensor_bytes", "bytes_moved")

FASTER = "faster"
SLOWER = "slower"
WITHIN = "within spread"
NO_SPREAD = "no spread recorded"
STATUS_CHANGED = "status changed"
ONLY_A = "only in baseline"
ONLY_B = "only in this run"
VERDICTS = (SLOWER, STATUS_CHANGED, FASTER, WITHIN, NO_SPREAD, ONLY_A, ONLY_B)
FLAGGED = (SLOWER, STATUS_CHANGED, FASTER)


@dataclass(frozen=True)
class RatioTable:
    """Values of one metric per target, side by side, with each target's ratio to the baseline target."""

    frame: pd.DataFrame
    baseline: str
    targets: list[str]
    value: str
    higher_is_better: bool
    matched_on: str  # "same cell" | "largest size each target ran"
    ratio_columns: list[str]


def throughput_column(df: pd.DataFrame) -> str | None:
    return next((c for c in THROUGHPUT_COLUMNS if c in df.columns and df[c].notna().any()), None)


def with_throughput(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The frame with one throughput per row, and its name.

    Most artifacts have one throughput column (``gbps``); some measure different things per row
    (ceilings: copy rows in GB/s, matmul rows in TFLOP/s): those are combined into ``throughput``,
    each row taking the first of its columns that has a value.
    """
    present = [c for c in THROUGHPUT_COLUMNS if c in df.columns and pd.to_numeric(df[c], errors="coerce").notna().any()]
    if not present:
        return df, None
    first = pd.to_numeric(df[present[0]], errors="coerce")
    combined = first.copy()
    used = [present[0]]
    for column in present[1:]:
        values = pd.to_numeric(df[column], errors="coerce")
        fills = combined.isna() & values.notna()
        if fills.any():
            combined = combined.where(~fills, values)
            used.append(column)
    if len(used) == 1:
        return df, present[0]
    name = "throughput (" + " | ".join(used) + ")"
    return df.assign(**{name: combined}), name


def ratio_label(target: str, baseline: str) -> str:
    return f"{target} vs {baseline} (×)"


def cross_target_ratios(
    df: pd.DataFrame,
    *,
    value: str,
    keys: Sequence[str] | None = None,
    baseline: str | None = None,
    higher_is_better: bool = True,
    size: str = SIZE_COLUMN,
) -> RatioTable | None:
    """Per cell, the metric on each target and each target's ratio to ``baseline`` (above 1: better).

    Only ``ok`` rows count. When the targets ran no common sizes (``auto`` sizes scale with each
    device) and ``value`` is a throughput, each target's largest size is compared instead, and the
    sizes are shown. Returns None when fewer than two targets have rows.
    """
    if df.empty or "target" not in df.columns or value not in df.columns:
        return None
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    ok = ok[ok[value].notna()]
    targets = sorted(ok["target"].astype(str).unique())
    if len(targets) < 2:
        return None
    baseline = baseline if baseline in targets else targets[0]
    keys = [k for k in (keys if keys is not None else key_columns(ok)) if k != "target" and k in ok.columns]
    if not keys:
        return None
    ok = ok.drop_duplicates(subset=[*keys, "target"])
    wide = ok.pivot_table(index=keys, columns="target", values=value, aggfunc="first")
    matched_on = "same cell"
    if wide.dropna().empty and size in keys and higher_is_better:
        rest = [k for k in keys if k not in (size, *SIZE_ORDER_COLUMNS)]
        # "size" may be a shape string (softmax "4096x1024"): order by element count when rows carry it.
        order = next((c for c in SIZE_ORDER_COLUMNS if c in ok.columns), size)
        magnitude = pd.to_numeric(ok[order], errors="coerce")
        if rest and magnitude.notna().all():
            largest = ok.loc[magnitude.groupby([ok[k] for k in [*rest, "target"]]).idxmax()]
            wide = largest.pivot_table(index=rest, columns="target", values=value, aggfunc="first")
            sizes = largest.pivot(index=rest, columns="target", values=size)
            for t in sizes.columns:
                wide[f"{size} ({t})"] = sizes[t]
            matched_on = "largest size each target ran"
    ratio_columns = []
    for t in targets:
        if t == baseline or t not in wide.columns or baseline not in wide.columns:
            continue
        name = ratio_label(t, baseline)
        wide[name] = wide[t] / wide[baseline] if higher_is_better else wide[baseline] / wide[t]
        ratio_columns.append(name)
    frame = wide.reset_index()
    frame.columns.name = None
    return RatioTable(frame, baseline, targets, value, higher_is_better, matched_on, ratio_columns)


def geometric_mean(values: pd.Series) -> float:
    clean = values[np.isfinite(values) & (values > 0)]
    return float(np.exp(np.log(clean).mean())) if not clean.empty else math.nan


# ---------------------------------------------------------------------------------------------- runs


def spread_verdict(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """Whether the median time moved by more than the spread measured in either run.

    Changed when the p10..p90 ranges of the two runs do not overlap; without percentiles, when the
    difference exceeds twice the combined standard deviation (cv x mean) of the two runs.
    """
    med_a, med_b = _num(a.get("median_ms")), _num(b.get("median_ms"))
    if math.isnan(med_a) or math.isnan(med_b):
        return NO_SPREAD
    lo_a, hi_a, lo_b, hi_b = (_num(a.get("p10_ms")), _num(a.get("p90_ms")), _num(b.get("p10_ms")),
                              _num(b.get("p90_ms")))
    if not any(math.isnan(v) for v in (lo_a, hi_a, lo_b, hi_b)):
        if lo_b > hi_a:
            return SLOWER
        if hi_b < lo_a:
            return FASTER
        return WITHIN
    cv_a, cv_b = _num(a.get("cv")), _num(b.get("cv"))
    if math.isnan(cv_a) or math.isnan(cv_b):
        return NO_SPREAD
    noise = 2 * math.hypot(cv_a * med_a, cv_b * med_b)
    if med_b - med_a > noise:
        return SLOWER
    if med_a - med_b > noise:
        return FASTER
    return WITHIN


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


RUN_COLUMNS = ("status", "median_ms", "p10_ms", "p90_ms", "cv", "reps")


def run_deltas(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str] | None = None) -> pd.DataFrame:
    """Match the cells of one artifact in a baseline run (``a``) and a new run (``b``) and judge each.

    Columns: the keys, ``status``/``median_ms``/``p10_ms``/``p90_ms``/``cv`` of each run (suffixes
    ``_a``, ``_b``), ``change_pct`` of the median time (positive: slower) and ``verdict``.
    """
    if keys is None:
        # Keys of each run on its own: the two runs together repeat every cell by design.
        keys = list(dict.fromkeys([*key_columns(a), *key_columns(b)]))
    keys = [k for k in keys if k in a.columns and k in b.columns]
    if not keys:
        raise ValueError("cannot match rows of two runs without key columns")
    keep = [c for c in RUN_COLUMNS if c in a.columns or c in b.columns]
    left = a.drop_duplicates(subset=keys)[[*keys, *[c for c in keep if c in a.columns]]]
    right = b.drop_duplicates(subset=keys)[[*keys, *[c for c in keep if c in b.columns]]]
    merged = left.merge(right, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    verdicts, changes = [], []
    for row in merged.to_dict("records"):
        side_a = {c: row.get(f"{c}_a") for c in keep}
        side_b = {c: row.get(f"{c}_b") for c in keep}
        change = math.nan
        if row["_merge"] == "left_only":
            verdict = ONLY_A
        elif row["_merge"] == "right_only":
            verdict = ONLY_B
        elif "status" in keep and side_a["status"] != side_b["status"]:
            verdict = STATUS_CHANGED
        elif "status" in keep and side_a["status"] != "ok":
            verdict = WITHIN  # both not ok for the same reason class: nothing measured to compare
        else:
            verdict = spread_verdict(side_a, side_b)
        med_a, med_b = _num(side_a.get("median_ms")), _num(side_b.get("median_ms"))
        if med_a > 0 and not math.isnan(med_b):
            change = 100.0 * (med_b / med_a - 1.0)
        verdicts.append(verdict)
        changes.append(change)
    merged = merged.drop(columns="_merge")
    merged["change_pct"] = changes
    merged["verdict"] = verdicts
    # What a reader looks for first (the verdict and the change) before the evidence, a run beside the other.
    evidence = [f"{c}_{side}" for c in keep for side in ("a", "b") if f"{c}_{side}" in merged.columns]
    merged = merged[[*keys, "verdict", "change_pct", *evidence]]
    order = {v: i for i, v in enumerate(VERDICTS)}
    return merged.sort_values(by=["verdict", *keys], key=lambda s: s.map(order) if s.name == "verdict" else s,
                              ignore_index=True)


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict to dotted keys (``device.name``), for listing what differs between two captures."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


# Parts of env.json that describe the capture rather than the software/hardware.
ENV_NOISE = ("captured_at", "tools.", "python.executable", "smi.")


def env_differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> pd.DataFrame:
    """Keys of two environment captures whose values differ (what changed between two runs)."""
    flat_a, flat_b = flatten(a or {}), flatten(b or {})
    rows = []
    for key in sorted(set(flat_a) | set(flat_b)):
        if key.startswith(ENV_NOISE):
            continue
        va, vb = flat_a.get(key), flat_b.get(key)
        if va != vb:
            rows.append({"key": key, "baseline": "–" if va is None else str(va),
                         "this run": "–" if vb is None else str(vb)})
    return pd.DataFrame(rows, columns=["key", "baseline", "this run"])


def value_columns(df: pd.DataFrame) -> list[str]:
    """Columns that are neither keys nor metadata: what a cell measured."""
    keys = set(key_columns(df)) | set(METADATA_COLUMNS)
    return [c for c in df.columns if c not in keys]
