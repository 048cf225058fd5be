"""Summary: per target, the device, what ran, what did not and why, and the headline figures.

Headline figures are read defensively from whatever the steps left: a step that has not run (or ran
with another schema) shows as "not measured", never as an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpulab.core.ceilings import BESIDE_THE_CASE, CEILINGS
from gpulab.core.ops import OPS
from gpulab.core.patterns import PATTERNS
from gpulab.core.tables import IDENTIFYING_COLUMNS, STATUSES
from gpulab.core.timing import MAX_CV, MAX_MEAN_OVER_MEDIAN, MIN_STABLE_REPS
from gpulab.report import findings
from gpulab.report.results import ResultsIndex

ORDER = 10
ID = "summary"
TITLE = "Summary"
TEMPLATE = "summary.html.j2"

# The LLM step's achieved-bandwidth percentage is its roofline percentage (bytes a step reads x tok/s vs the
# read-only ceiling).
ROOFLINE_PCT = ("pct_of_ceiling",)


@dataclass(frozen=True)
class Headline:
    key: str
    label: str
    unit: str
    value: float = math.nan
    detail: str = ""
    pct: float = math.nan
    pct_of: str = ""
    higher_is_better: bool = True

    @property
    def measured(self) -> bool:
        return not math.isnan(self.value)

    def shown(self, flops: findings.Unit, value: float | None = None) -> tuple[float, str]:
        """Value and unit as displayed: matmul rates in the page's one unit for them (findings.flop_unit)."""
        value = self.value if value is None else value
        if self.unit == "TFLOP/s":
            return value * flops.scale, flops.name
        return value, self.unit


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0] if "status" not in df.columns else df
    return df[df["status"] == "ok"]


def _best(df: pd.DataFrame, column: str) -> pd.Series | None:
    values = pd.to_numeric(df[column], errors="coerce")
    if values.notna().sum() == 0:
        return None
    return df.loc[values.idxmax()]


def _describe(row: pd.Series, columns: tuple[str, ...]) -> str:
    parts = []
    for c in columns:
        if c in row.index and pd.notna(row[c]) and str(row[c]) != "":
            value = row[c]
            if c == "size" and isinstance(value, (int, float)):
                value = f"{int(value):,}"
            parts.append(str(value))
    return " · ".join(parts)


def _pct(row: pd.Series, names: tuple[str, ...]) -> float:
    for name in names:
        if name in row.index:
            value = pd.to_numeric(pd.Series([row[name]]), errors="coerce").iloc[0]
            if pd.notna(value):
                return float(value)
    return math.nan


def gelu_headline(results: ResultsIndex, target: str) -> Headline:
    base = Headline("gelu_gbps", "Best GeLU bandwidth", "GB/s", pct_of="measured copy ceiling (1 read + 1 write)")
    path = results.path(target, "bench/gelu.csv")
    if not path.is_file():
        return base
    ok = _ok_rows(results.read_csv(path, target))
    if ok.empty or "gbps" not in ok.columns:
        return base
    row = _best(ok, "gbps")
    if row is None:
        return base
    return Headline(base.key, base.label, base.unit, float(row["gbps"]), _describe(row, ("impl", "dtype", "size")),
                    _pct(row, ("pct_of_ceiling",)), _gelu_ceiling_words(row, base.pct_of))


def _gelu_ceiling_words(row: pd.Series, default: str) -> str:
    """What the best GeLU row's percentage is of: where it beat every copy method at its size, it is that size's
    ceiling itself (gpulab.core.ceilings.share_ceilings); where the memcpy timed beside it set the ceiling, that
    figure. Either way the copy card beside it (the ceilings job's plateau) shows another number."""
    dedicated = pd.to_numeric(pd.Series([row.get("dedicated_ceiling_gbps")]), errors="coerce").iloc[0]
    method = str(row.get("ceiling_method", ""))
    if pd.isna(dedicated):
        return default
    if "fastest row" in method:
        setter = method.split(" (", 1)[0]  # "<op> <impl>" of the row that beat every method (share_ceilings)
        who = "this row" if setter == f"{row.get('op')} {row.get('impl')}" else f"the {setter} row of its bytes"
        return f"the ceiling at its size, which {who} set: the copy methods reached {dedicated:,.0f} GB/s there"
    if method.endswith(BESIDE_THE_CASE):
        return f"{default}: {dedicated:,.1f} GB/s, {method}"
    return default


def llm_headline(results: ResultsIndex, target: str) -> Headline:
    """Decode tokens/s (llama-bench's tg test) of the biggest model measured, fastest engine."""
    base = Headline("llm_decode", "LLM decode", "tok/s", pct_of="read-only roofline")
    frames = [results.read_csv(p, target) for p in sorted(results.path(target, "llm").glob("*.csv"))]
    df = _ok_rows(pd.concat([f for f in frames if not f.empty], ignore_index=True)) if frames else pd.DataFrame()
    if df.empty or not {"test", "tok_s"}.issubset(df.columns):
        return base
    df = df[df["test"].astype(str).str.match(r"tg\d+$")]
    if "model_source" in df.columns and not df.empty:
        # The study's model (real weights, else its architecture with random ones) before the tiny CI model.
        rank = df["model_source"].map({"real": 0, "random": 1, "tiny": 2}).fillna(3)
        df = df[rank == rank.min()]
    row = _best(df, "tok_s") if not df.empty else None
    if row is None:
        return base
    return Headline(base.key, base.label, base.unit, float(row["tok_s"]),
                    _describe(row, ("model", "engine", "test", "dtype")), _pct(row, ROOFLINE_PCT), base.pct_of)


def mlp_headline(results: ResultsIndex, target: str) -> Headline:
    """Matmul TFLOP/s of the MLP's forward+backward step, best variant, against the matmul ceiling."""
    base = Headline("mlp_tflops", "MLP fwd+bwd step", "TFLOP/s", pct_of="measured matmul rate")
    path = results.path(target, "mlp/summary.csv")
    df = _ok_rows(results.read_csv(path, target)) if path.is_file() else pd.DataFrame()
    if df.empty or "tflops" not in df.columns:
        return base
    row = _best(df, "tflops")
    if row is None:
        return base
    return Headline(base.key, base.label, base.unit, float(row["tflops"]), _describe(row, ("variant",)),
                    _pct(row, ("pct_of_ceiling",)), base.pct_of)


CEILING_HEADLINES = tuple((name, p.headline, p.column, p.unit) for name, p in PATTERNS.items())


def ceiling_headlines(results: ResultsIndex, target: str) -> list[Headline]:
    """The best of each ceiling (over sizes, dtypes and methods), with the method that set it."""
    path = results.path(target, CEILINGS.path)
    ok = _ok_rows(results.read_csv(path, target)) if path.is_file() else pd.DataFrame()
    out = []
    for kind, label, column, unit in CEILING_HEADLINES:
        headline = Headline(f"{kind}_{column}", label, unit)
        rows = ok[ok["kind"] == kind] if {"kind", column}.issubset(ok.columns) else ok.iloc[0:0]
        row = _best(rows, column) if not rows.empty else None
        if row is not None:
            headline = Headline(headline.key, label, unit, float(row[column]),
                                _describe(row, ("dtype", "size", "method")))
        out.append(headline)
    return out


HEADLINES: tuple[Callable[[ResultsIndex, str], Headline | list[Headline]], ...] = (
    gelu_headline, llm_headline, mlp_headline, ceiling_headlines,
)


def headlines(results: ResultsIndex, target: str) -> list[Headline]:
    out: list[Headline] = []
    for fn in HEADLINES:
        found = fn(results, target)
        out.extend(found if isinstance(found, list) else [found])
    return out


def _plain(value: Any) -> str:
    """A cell value as written in the config: 1024, not 1024.0 (a column with gaps reads as float)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cells(group: pd.DataFrame) -> str:
    """Which cells a group of rows covers, e.g. ``impl: triton, cpp_ext · dtype: fp16, bf16``."""
    parts = []
    for column in IDENTIFYING_COLUMNS:
        if column not in group.columns:
            continue
        values = [_plain(v) for v in dict.fromkeys(group[column].dropna()) if str(v) != ""]
        if not values:
            continue
        shown = ", ".join(values[:4]) + (f" +{len(values) - 4} more" if len(values) > 4 else "")
        parts.append(f"{column}: {shown}")
    return " · ".join(parts)


def outcomes(ctx: Any, target: str) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Per artifact the count of each status, and the rows that are not ok grouped by reason."""
    counts: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    rule_outputs = (ctx.config.get("_workflow") or {}).get("rule_outputs") or {}
    for relpath, frame in ctx.results.artifacts(target):
        step = relpath.rsplit(".", 1)[0]
        status = frame["status"].astype(str)
        counts.append({"artifact": step, **{s: int((status == s).sum()) for s in STATUSES}})
        bad = frame[status != "ok"]
        for (state, why), group in bad.groupby([bad["status"].astype(str), bad["reason"].astype(str)], sort=False):
            logs = ctx.results.logs_for(target, relpath, group, rule_outputs)
            problems.append({
                "artifact": step, "status": state, "rows": len(group), "cells": _cells(group),
                "reason": why or "(no reason recorded)",
                "logs": [{"name": p.name, "href": ctx.link(p)} for p in logs[:3]],
                "more_logs": max(0, len(logs) - 3),
            })
    severity = {s: i for i, s in enumerate(("incorrect", "failed", "oom", "skipped"))}
    problems.sort(key=lambda p: (severity.get(p["status"], 9), p["artifact"]))
    return pd.DataFrame(counts, columns=["artifact", *STATUSES]), problems


def not_ok_by_step(problems: list[dict[str, Any]], device_reason: str) -> dict[str, Any]:
    """The rows that are not ok, per status and step (``bench 60, build 12``), and how many of them say the
    target's own reason for having no GPU."""
    by_status: dict[str, dict[str, int]] = {}
    for p in problems:
        steps = by_status.setdefault(p["status"], {})
        step = p["artifact"].split("/", 1)[0]
        steps[step] = steps.get(step, 0) + p["rows"]
    no_gpu = sum(p["rows"] for p in problems if device_reason and device_reason in p["reason"])
    return {"by_status": {s: {"total": sum(v.values()), "steps": v} for s, v in by_status.items()},
            "no_gpu": no_gpu, "device_reason": device_reason}


def _delta(current: Headline, before: Headline | None, flops: findings.Unit) -> dict[str, Any] | None:
    if before is None or not (current.measured and before.measured) or before.value == 0:
        return None
    change = 100.0 * (current.value / before.value - 1.0)
    better = change > 0 if current.higher_is_better else change < 0
    return {"pct": change, "better": better, "before": current.shown(flops, before.value)[0]}


def _side_by_side(ctx: Any, table_rows: dict[str, dict[str, Any]],
                  llm_models: dict[str, str]) -> dict[str, Any] | None:
    """The headline figures of every target in one table, with each target's ratio to the baseline target."""
    baseline = ctx.baseline_target
    frame = pd.DataFrame(list(table_rows.values()))
    for t in [t for t in ctx.results.targets if t != baseline]:
        if t in frame.columns and baseline in frame.columns:
            ratio = frame[t] / frame[baseline]
            # Decode speed of a 7B model and of the tiny CI model are not comparable: no ratio then.
            if llm_models.get(t) != llm_models.get(baseline):
                ratio = ratio.where(frame["figure"] != table_rows["llm_decode"]["figure"])
            frame[f"{t} vs {baseline} (×)"] = ratio
    if len(set(llm_models.values())) > 1:
        frame.loc[frame["figure"] == table_rows["llm_decode"]["figure"], "figure"] = (
            "LLM decode (tok/s; models differ: " + ", ".join(f"{t}: {m}" for t, m in llm_models.items()) + ")"
        )
    measured = [t for t in ctx.results.targets if t in frame.columns and frame[t].notna().any()]
    return {"frame": frame, "baseline": baseline} if len(measured) > 1 else None


def build(ctx: Any) -> dict[str, Any] | None:
    figures = {t: headlines(ctx.results, t) for t in ctx.results.targets}
    flops = findings.flop_unit(ctx.results)
    targets = []
    table_rows: dict[str, dict[str, Any]] = {}
    llm_models: dict[str, str] = {}
    for target in ctx.results.targets:
        env = ctx.results.env(target) or {}
        device = env.get("device", {})
        counts, problems = outcomes(ctx, target)
        before = {}
        if ctx.baseline is not None and target in ctx.baseline.targets:
            before = {h.key: h for h in headlines(ctx.baseline, target)}
        totals = {s: int(counts[s].sum()) if not counts.empty else 0 for s in STATUSES}
        tiles = []
        for h in figures[target]:
            value, unit = h.shown(flops)
            tiles.append({"h": h, "value": value, "unit": unit,
                          "delta": _delta(h, before.get(h.key), flops)})
        targets.append({
            "name": target,
            "device": device.get("name", "unknown device"),
            "backend": device.get("backend", "unknown"),
            "arch": device.get("arch"),
            "memory_gib": (device.get("total_memory_bytes") or 0) / 2**30,
            "gpu": bool(device.get("gpu_available")),
            "reason": device.get("reason", ""),
            "torch": device.get("torch_version") or env.get("packages", {}).get("torch"),
            "fingerprint": env.get("fingerprint", "–"),
            "has_env": bool(env),
            "counts": counts,
            "totals": totals,
            "problems": problems,
            "headlines": tiles,
            "above": findings.above_ceiling(ctx.results, target),
            "unstable": findings.instability(ctx.results, target),
            "throttled": findings.throttled_rows(ctx.results, target) if device.get("gpu_available") else None,
            "verdict": findings.verdict(ctx.results, target, tuple(OPS)),
            "not_ok": not_ok_by_step(problems, device.get("reason", "")),
            "log_dir": ctx.link(log_dir) if (log_dir := ctx.results.path(target, "logs")).is_dir() else None,
        })
        for h in figures[target]:
            row = table_rows.setdefault(h.key, {"figure": f"{h.label} ({h.unit})"})
            row[target] = h.value
            if h.key == "llm_decode" and h.measured:
                llm_models[target] = h.detail.split(" · ", 1)[0]
    comparison = _side_by_side(ctx, table_rows, llm_models) if ctx.multi_target else None
    rule = {"ratio": f"{MAX_MEAN_OVER_MEDIAN:.2f}", "cv": f"{MAX_CV:.2f}", "reps": MIN_STABLE_REPS}
    return {"targets": targets, "comparison": comparison, "rule": rule}
