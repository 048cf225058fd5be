"""The verdict, first on the page: per target, the performance goals met and missed (each miss linked to its row),
each op's fastest row as GB/s, % of the measured ceiling and % of the datasheet (never a row's share of a ceiling it
set itself), and one small figure per op of GB/s against size.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gpulab.core.ops import OPS as OP_SPECS
from gpulab.report import findings, plots
from gpulab.report.formats import anchor, method_words, size_words

ORDER = 5
ID = "verdict"
TITLE = "Verdict"
TEMPLATE = "verdict.html.j2"
# The dtype the first screen's figure draws (every dtype is in the benchmark section).
FIGURE_DTYPE = "fp32"


def _number(value: Any) -> float:
    number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    return float(number) if pd.notna(number) else math.nan


def scoreboard(goals: pd.DataFrame, target: str) -> dict[str, Any] | None:
    """Goal cells of one target per op and dtype: how many met, how many missed, and each miss with its row."""
    mine = goals[goals["target"] == target] if not goals.empty else goals
    if mine.empty:
        return None
    dtypes = [d for d in ("fp32", "fp16", "bf16") if d in set(mine["dtype"])]
    rows = []
    for op, part in mine.groupby("op", sort=False):
        cells = {}
        for dtype in dtypes:
            verdicts = part.loc[part["dtype"] == dtype, "verdict"]
            cells[dtype] = {"met": int((verdicts == "met").sum()), "missed": int((verdicts != "met").sum())}
        rows.append({"op": op, "cells": cells, "met": int((part["verdict"] == "met").sum()), "total": len(part)})
    misses = [{"op": r["op"], "impl": r["impl"], "size": r["size"], "why": r["verdict"].removeprefix("missed: "),
               "pct": r["% of ceiling"], "goal": r["goal %"], "slower": r["% slower than best(native, compile)"],
               "anchor": r["anchor"]} for _, r in mine[mine["verdict"] != "met"].iterrows()]
    return {"dtypes": dtypes, "rows": rows, "misses": misses,
            "met": sum(r["met"] for r in rows), "total": sum(r["total"] for r in rows)}


def _ceiling_stability(ceilings: pd.DataFrame, target: str) -> dict[tuple[str, str, float], float]:
    """The cv of every ceiling that is not stable, by (pattern, dtype, bytes): the ceilings job's best rows."""
    if ceilings.empty or not {"best", "stable", "kind"}.issubset(ceilings.columns):
        return {}
    best = ceilings[(ceilings["target"] == target) & (ceilings["best"].astype(str).str.lower() == "true")]
    shaky = best[best["stable"].astype(str).str.lower() == "false"]
    return {(str(r["kind"]), str(r["dtype"]), _number(r["tensor_bytes"])): _number(r.get("cv"))
            for _, r in shaky.iterrows()}


def headline(ctx: Any, frame: pd.DataFrame, op: str, target: str, shaky: dict) -> dict[str, Any] | None:
    """The op's fastest row at any size (its best GB/s), against the methods' ceiling and the datasheet."""
    ok = frame[(frame["status"] == "ok") & (frame["target"] == target)]
    ok = ok[pd.to_numeric(ok["gbps"], errors="coerce").notna()]
    if ok.empty:
        return None
    row = ok.loc[pd.to_numeric(ok["gbps"]).idxmax()]
    method = str(row.get("ceiling_method", ""))
    own = method == f"{op} {row['impl']} {findings.OWN_CEILING}"
    cell = ok[(ok["size"] == row["size"]) & (ok["dtype"] == row["dtype"])].sort_values("gbps", ascending=False)
    ceiling_cv = shaky.get((str(row.get("pattern")), str(row["dtype"]), _number(row.get("ceiling_bytes"))))
    if own and str(row.get("stable")).lower() == "false":
        ceiling_cv = _number(row.get("cv"))
    logs = ctx.results.logs_for(target, f"bench/{op}.csv", ok[ok["impl"] == row["impl"]],
                                (ctx.config.get("_workflow") or {}).get("rule_outputs") or {})
    table = ctx.results.path(target, f"bench/{op}.csv")
    return {
        "op": op, "impl": row["impl"], "size": size_words(row["size"], row["dtype"], row.get("tensor_bytes")),
        "gbps": _number(row["gbps"]), "own": own, "pct": math.nan if own else _number(row.get("pct_of_ceiling")),
        "methods_gbps": _number(row.get("dedicated_ceiling_gbps")), "method": method_words(method),
        "method_short": method_words(method).split(" (")[0],
        "datasheet_gbps": _number(row.get("datasheet_gbps")), "pct_datasheet": _number(row.get("pct_of_datasheet")),
        "ceiling_cv": ceiling_cv, "stable": str(row.get("stable")).lower() != "false",
        "ranking": [{"impl": r["impl"], "gbps": _number(r["gbps"]), "pct_datasheet": _number(r.get("pct_of_datasheet"))}
                    for _, r in cell.iterrows()],
        "row": "#" + anchor("fastest", target, op, row["size"], row["dtype"]),
        "log": ctx.link(logs[0]) if logs else None, "log_name": logs[0].name if logs else None,
        "table": ctx.link(table), "table_name": f"bench/{op}.csv",
    }


def figure(frames: dict[str, pd.DataFrame], target: str, label: str, datasheet: float) -> plots.Figure | None:
    """GB/s against size per op (small multiples), the figure dtype's rows of one target."""
    parts = [df[(df["target"] == target) & (df["dtype"] == FIGURE_DTYPE)] for df in frames.values()]
    data = pd.concat([p for p in parts if not p.empty], ignore_index=True) if any(not p.empty for p in parts) else None
    if data is None or data[data["status"] == "ok"].empty:
        return None
    data = data.assign(methods_gbps=pd.to_numeric(data.get("dedicated_ceiling_gbps"), errors="coerce"))
    ops = [op for op in frames if op in set(data["op"])]
    return plots.roofline_multiples(
        data, facets=ops, datasheet=datasheet, facet_titles={op: f"{op} ({OP_SPECS[op].pattern})" for op in ops},
        alt=f"GB/s against bytes per tensor for each op on {label} ({FIGURE_DTYPE}), an implementation a line, with "
            "the ceiling the methods measured at each size and the datasheet bandwidth",
        data_columns=["op", "impl", "size", "dtype", "tensor_bytes", "status", "gbps", "methods_gbps",
                      "ceiling_method", "pct_of_ceiling", "pct_of_datasheet", "median_ms", "stable"])


def _target(ctx: Any, target: str, frames: dict[str, pd.DataFrame], goals: pd.DataFrame,
            ceilings: pd.DataFrame) -> dict[str, Any]:
    device = ctx.devices.get(target) or {}
    shaky = _ceiling_stability(ceilings, target)
    heads = [h for op, df in frames.items() if (h := headline(ctx, df, op, target, shaky)) is not None]
    datasheet = next((h["datasheet_gbps"] for h in heads if not math.isnan(h["datasheet_gbps"])), math.nan)
    rest = findings.verdict(ctx.results, target, ())
    unstable = findings.instability(ctx.results, target)
    return {
        "name": target, "label": ctx.target_labels.get(target, target), "gpu": bool(device.get("gpu_available")),
        "reason": device.get("reason", ""), "scoreboard": scoreboard(goals, target), "headlines": heads,
        "datasheet": datasheet, "mlp": rest["mlp"], "llm": rest["llm"],
        "figure": figure(frames, target, ctx.target_labels.get(target, target), datasheet),
        "above": len(findings.above_ceiling(ctx.results, target)),
        "unstable": sum(u["unstable"] for u in unstable), "measured": sum(u["rows"] for u in unstable),
        "throttled": findings.throttled_rows(ctx.results, target) if device.get("gpu_available") else None,
    }


def build(ctx: Any) -> dict[str, Any] | None:
    frames = {op: ctx.results.table(f"bench/{op}.csv") for op in OP_SPECS}
    frames = {op: df.assign(size=df["size"].astype(str)) for op, df in frames.items() if not df.empty}
    if not frames and not ctx.results.targets:
        return None
    everything = pd.concat(frames.values(), ignore_index=True) if frames else pd.DataFrame()
    gpu_targets = [t for t in ctx.results.targets if (ctx.devices.get(t) or {}).get("gpu_available")]
    goals = findings.goal_rows(everything, gpu_targets) if frames else pd.DataFrame()
    ceilings = ctx.results.table("bench/ceilings.csv")
    # GPU targets first: theirs are the goals judged, and the first screen should show one.
    order = sorted(ctx.results.targets, key=lambda t: t not in gpu_targets)
    targets = [_target(ctx, t, frames, goals, ceilings) for t in order]
    return {"targets": targets, "figure_dtype": FIGURE_DTYPE, "flops": findings.flop_unit(ctx.results)}
