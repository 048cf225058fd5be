"""Comparison across targets: for every measured artifact, each cell's ratio between machines.

Shown only when ``results/`` holds more than one target (e.g. results copied in from an AMD and an
NVIDIA machine). The step sections already draw targets side by side; this section answers "how
many times faster is one machine than the other, cell by cell" for everything measured.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.report.compare import cross_target_ratios, geometric_mean, with_throughput
from gpulab.report.plots import ratio_strip
from gpulab.report.results import is_measured, key_columns

ORDER = 70
ID = "across-targets"
TITLE = "Comparison across targets"
TEMPLATE = "across.html.j2"

GROUP_COLUMNS = ("impl", "variant", "engine", "kind")


def _ratio_summary(compared: pd.DataFrame, ratio_columns: list[str]) -> list[dict[str, Any]]:
    """Per other target: how many cells were compared, and their ratios' geometric mean and range."""
    return [{"target": column.split(" vs ", 1)[0], "cells": int(compared[column].notna().sum()),
             "geometric mean (×)": geometric_mean(compared[column]),
             "min (×)": compared[column].min(), "max (×)": compared[column].max()} for column in ratio_columns]


def _strip_rows(name: str, compared: pd.DataFrame, ratio_columns: list[str], group: str | None) -> list[dict]:
    """One point per compared cell and other target, for the overview's strip plot."""
    return [{"cell": name.rsplit(".", 1)[0] + (f" · {row[group]}" if group else ""),
             "target": column.split(" vs ", 1)[0], "ratio": row[column]}
            for column in ratio_columns for _, row in compared[compared[column].notna()].iterrows()]


def build(ctx: Any) -> dict[str, Any] | None:
    if not ctx.multi_target:
        return None
    baseline = ctx.baseline_target
    artifacts = []
    strip_rows = []
    for name in ctx.results.artifact_names():
        if name.startswith("env/"):
            continue
        frame = ctx.results.table(name)
        if frame.empty or not is_measured(frame) or frame["target"].nunique() < 2:
            continue
        frame, value = with_throughput(frame)
        higher = value is not None
        value = value or "median_ms"
        keys = [k for k in key_columns(frame) if k != "target"]
        table = cross_target_ratios(frame, value=value, keys=keys, baseline=baseline, higher_is_better=higher)
        if table is None:
            continue
        group = next((c for c in GROUP_COLUMNS if c in table.frame.columns), None)
        compared = table.frame.dropna(subset=table.ratio_columns, how="all") if table.ratio_columns else table.frame
        summary = _ratio_summary(compared, table.ratio_columns)
        strip_rows += _strip_rows(name, compared, table.ratio_columns, group)
        artifacts.append({
            "name": name,
            "value": value,
            "higher": higher,
            "matched_on": table.matched_on,
            "table": compared,
            "unmatched": len(table.frame) - len(compared),
            "summary": pd.DataFrame(summary),
        })
    if not artifacts:
        return {"baseline": baseline, "artifacts": [], "overview": None, "targets": ctx.results.targets}
    strip = pd.DataFrame(strip_rows)
    figure = None
    if not strip.empty:
        multi_others = strip["target"].nunique() > 1
        figure = ratio_strip(
            strip, ratio="ratio", row="cell", hue="target" if multi_others else None,
            xlabel=f"speed relative to {baseline} (×, log scale; right of the line: faster than {baseline})",
            alt=f"Per-cell speed of each target relative to {baseline}, by artifact and implementation",
            caption="Each dot is one cell measured on both targets; diamonds are geometric means. "
                    "Throughput ratios where the artifact has a throughput column, inverse time ratios otherwise.",
        )
    return {"baseline": baseline, "artifacts": artifacts, "overview": figure, "targets": ctx.results.targets}
