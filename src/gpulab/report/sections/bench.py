"""Kernel benchmarks: per op, achieved bandwidth against the ceiling of its access pattern at the row's own
size (latency-bound sizes, where even the ceiling is far from bandwidth, get no percentage), speed-ups over
``native``, the correctness gate's findings, timing stability and GPU throttling, rows above their
ceiling (in red: the ceiling is then not trustworthy), the study's GeLU figures beside ours, and the
performance goals set for an H100 checked against the rows."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gpulab.bench.impls import IMPLEMENTATIONS
from gpulab.bench.registry import BASELINE
from gpulab.core.ceilings import CEILINGS, with_regimes
from gpulab.core.dtypes import ITEMSIZE
from gpulab.core.ops import OPS as OP_SPECS
from gpulab.report import plots

ORDER = 40
ID = "bench"
TITLE = "Kernel benchmarks"
TEMPLATE = "bench.html.j2"

DTYPES = tuple(ITEMSIZE)
# The lecture's GeLU on a 16384x16384 fp32 tensor (a 2^28-element vector here), in ms.
STUDY_GELU_ELEMENTS = 16384 * 16384
STUDY_GELU = tuple((f.name, *f.study) for f in IMPLEMENTATIONS.values() if f.study)
# Each op's performance goal (its registry entry's ``goal``) is met by the implementations held to it at most this
# much slower than the best of the goal's reference implementations (native and torch_compile) in the same cell.
GOAL_IMPLS = tuple(f.name for f in IMPLEMENTATIONS.values() if f.goal == "held")
GOAL_REFERENCE = tuple(f.name for f in IMPLEMENTATIONS.values() if f.goal == "reference")
GOAL_SLOWDOWN = 1.03


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if not df.empty else df


def _size_order(df: pd.DataFrame) -> list[str]:
    return list(df.sort_values("numel")["size"].astype(str).drop_duplicates())


SAME_SIZE = "ceiling (same size)"
LATENCY_BOUND = "latency-bound"


def regime_label(values: pd.Series) -> pd.Series:
    """``latency`` as the report says it; tables from before the regime existed show nothing."""
    return values.replace({"latency": LATENCY_BOUND}) if values is not None else values


def above_ceiling(df: pd.DataFrame) -> pd.DataFrame:
    """ok rows faster than their pattern's ceiling by more than the spread of both: the ceiling is wrong."""
    ok = _ok(df)
    if ok.empty or "above_ceiling" not in ok.columns:
        return pd.DataFrame()
    bad = ok[ok["above_ceiling"].astype(str).str.lower() == "true"]
    columns = ["target", "op", "impl", "size", "dtype", "pattern", "gbps", "dedicated_ceiling_gbps", "ceiling_method",
               "pct_of_ceiling", "p10_ms", "p90_ms"]
    return bad[[c for c in columns if c in bad.columns]]


def unsteady(df: pd.DataFrame) -> pd.DataFrame:
    """ok rows whose timing was not stable or during which the GPU throttled."""
    ok = _ok(df)
    if ok.empty or "stable" not in ok.columns:
        return pd.DataFrame()
    unstable = ok["stable"].astype(str).str.lower() != "true"
    throttled = ok.get("throttled", pd.Series("", index=ok.index)).astype(str).str.startswith("yes")
    out = ok[unstable | throttled]
    columns = ["target", "impl", "size", "dtype", "stable", "reps", "cv", "mean_ms", "median_ms", "throttled"]
    return out[columns if throttled.any() else columns[:-1]]


def size_label(size: str) -> str:
    """A size as every figure and heading of this section shows it: elements per tensor in short form
    (98.4k, 4.19M), or a softmax shape (rows x columns) as it is."""
    return plots.format_count(float(size)) if str(size).isdigit() else str(size)


def size_figure(df: pd.DataFrame, *, y: str, hue: str, col: str, facets: list[str], ceilings: dict,
                ylow: str, yhigh: str, ylabel: str, xlabel: str, alt: str, caption: str,
                data_columns: list[str]) -> plots.Figure:
    """GB/s per size, in size order (one panel per dtype), for every op alike: each implementation a line with
    its p10-p90 band, the ceiling at each size dotted and the ceiling at the largest size dashed."""
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"]
    order = list(ok.sort_values(["tensor_bytes", "numel"])["size"].astype(str).drop_duplicates())
    position = {size: i for i, size in enumerate(order)}
    names = plots.series_order(n for n in ok[hue].astype(str).unique() if n != SAME_SIZE)
    colors = plots.series_colors(names)
    fig, axes = plt.subplots(1, len(facets), figsize=(plots.FIG_WIDTH_IN, plots.PANEL_HEIGHT_IN + 0.5),
                             sharey=True, squeeze=False)
    for ax, facet in zip(axes[0], facets, strict=True):
        part = ok[ok[col] == facet].assign(pos=lambda d: d["size"].astype(str).map(position)).sort_values("pos")
        for name in names:
            line = part[part[hue].astype(str) == name]
            if not line.empty:
                ax.plot(line["pos"], line[y], marker="o", markersize=4, linewidth=1.6, color=colors[name], label=name)
                ax.fill_between(line["pos"], line[ylow], line[yhigh], color=colors[name], alpha=0.18, linewidth=0)
        same = part[part[hue].astype(str) == SAME_SIZE]
        if not same.empty:
            ax.plot(same["pos"], same[y], marker=".", linestyle=":", linewidth=1.4, color=plots.CEILING_COLOR,
                    label=SAME_SIZE)
        for label, value in ceilings.get(facet, {}).items():
            plots.draw_ceiling(ax, value, label)
        ax.set_xticks(range(len(order)), [size_label(s) for s in order], rotation=35, ha="right")
        ax.set_title(facet)
        ax.set_xlabel(xlabel)
    for ax in axes[0]:  # once all panels are drawn: on shared axes an earlier call froze the first panel's scale
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel(ylabel)
    plots.shared_legend(fig, list(axes[0]), None)
    return plots.embed(fig, alt, caption, df[[c for c in data_columns if c in df.columns]])


def with_regime(ceilings: pd.DataFrame) -> pd.DataFrame:
    """The ceilings table with each memory row's regime as the report says it (``ceilings.with_regimes``)."""
    table = with_regimes(ceilings)
    return table.assign(regime=regime_label(table["regime"])) if "regime" in table.columns else table


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per ok cell: how many times faster than ``native`` on the same target, size and dtype."""
    ok = _ok(df)
    keys = ["target", "op", "size", "dtype"]
    base = ok[ok["impl"] == BASELINE][[*keys, "median_ms"]].rename(columns={"median_ms": "native_ms"})
    out = ok.merge(base, on=keys, how="inner")
    out["speedup"] = out["native_ms"] / out["median_ms"]
    return out[[*keys, "numel", "impl", "median_ms", "native_ms", "speedup"]]


def fastest(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct implementation per target, size and dtype (incorrect rows never qualify)."""
    ok = _ok(df)
    if ok.empty:
        return pd.DataFrame()
    best = ok.loc[ok.groupby(["target", "size", "dtype"])["median_ms"].idxmin()]
    native = ok[ok["impl"] == BASELINE].set_index(["target", "size", "dtype"])["median_ms"]
    best = best.assign(vs_native=[native.get((t, s, d), math.nan) / m for t, s, d, m in
                                  best[["target", "size", "dtype", "median_ms"]].itertuples(index=False)])
    best = best.sort_values(["target", "numel", "dtype"])
    return pd.DataFrame({
        "target": best["target"], "size": best["size"], "dtype": best["dtype"], "fastest": best["impl"],
        "median ms": best["median_ms"], "GB/s": best["gbps"], "regime": regime_label(best.get("regime")),
        "% of ceiling": best["pct_of_ceiling"], "ceiling method": best["ceiling_method"], "stable": best["stable"],
        "× native": best["vs_native"],
    })


def correctness(df: pd.DataFrame) -> pd.DataFrame:
    """The gate's findings per target, implementation and dtype: cases checked, failures, worst error."""
    rows = []
    for (target, impl, dtype), group in df.groupby(["target", "impl", "dtype"], sort=False):
        checked = group[group["status"].isin(["ok", "incorrect"])]
        errors = pd.to_numeric(checked["rel_err"], errors="coerce")
        rows.append({
            "target": target, "impl": impl, "dtype": dtype, "cases": len(group), "checked": len(checked),
            "passed": int((group["status"] == "ok").sum()), "incorrect": int((group["status"] == "incorrect").sum()),
            "worst rel. error": float(errors.max()) if errors.notna().any() else math.nan,
            "worst element / bound": float(pd.to_numeric(checked["element_err_ratio"], errors="coerce").max()),
            "tolerance": float(pd.to_numeric(group["tolerance"], errors="coerce").max()),
            "not checked": ", ".join(f"{n} {s}" for s, n in group["status"].value_counts().items()
                                     if s not in ("ok", "incorrect")),
        })
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    order = {name: i for i, name in enumerate(plots.series_order(out["impl"]))}
    return out.sort_values(["target", "impl", "dtype"], key=lambda s: s.map(order) if s.name == "impl" else
                           s.map({d: i for i, d in enumerate(DTYPES)}) if s.name == "dtype" else s)


def problems(df: pd.DataFrame) -> pd.DataFrame:
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return pd.DataFrame()
    grouped = bad.groupby(["target", "impl", "status", "reason"], sort=False)
    return pd.DataFrame([{"target": t, "impl": i, "status": s, "cases": len(g),
                          "sizes": ", ".join(dict.fromkeys(g["size"].astype(str).map(size_label))), "reason": r}
                         for (t, i, s, r), g in grouped])


def study_gelu(gelu: pd.DataFrame, targets: list[str]) -> pd.DataFrame:
    """The lecture's GeLU timings next to ours at the same size (2^28 elements, fp32)."""
    ok = _ok(gelu)
    if not ok.empty:
        ok = ok[(pd.to_numeric(ok["numel"]) == STUDY_GELU_ELEMENTS) & (ok["dtype"] == "fp32")]
    rows = []
    for impl, label, study_ms in STUDY_GELU:
        row: dict[str, Any] = {"impl": impl, "study": label, "study (ms)": study_ms,
                               "study × manual": STUDY_GELU[0][2] / study_ms}
        for target in targets:
            hit = ok[(ok["target"] == target) & (ok["impl"] == impl)] if not ok.empty else ok
            ours = float(hit["median_ms"].iloc[0]) if not hit.empty else math.nan
            manual = ok[(ok["target"] == target) & (ok["impl"] == "manual")] if not ok.empty else ok
            manual_ms = float(manual["median_ms"].iloc[0]) if not manual.empty else math.nan
            row[f"{target} (ms)"] = ours
            row[f"{target} × manual"] = manual_ms / ours if ours == ours else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def goals(df: pd.DataFrame, gpu_targets: list[str]) -> pd.DataFrame:
    """Each goal cell on each GPU target: % of the pattern's ceiling, ratio to the best of
    native and torch_compile, and whether both goals are met."""
    ok = _ok(df)
    if ok.empty:
        return pd.DataFrame()
    ok = ok[ok["target"].isin(gpu_targets)]
    keys = ["target", "op", "size", "dtype"]
    reference = ok[ok["impl"].isin(GOAL_REFERENCE)].groupby(keys)["median_ms"].min()
    wanted = ok["impl"].isin(GOAL_IMPLS) & pd.Series([_goal_case(r) for r in ok.itertuples(index=False)],
                                                     index=ok.index, dtype=bool)
    rows = []
    for r in ok[wanted].sort_values(["target", "op", "impl", "numel", "dtype"]).itertuples(index=False):
        best_ms = reference.get((r.target, r.op, r.size, r.dtype), math.nan)
        slowdown = r.median_ms / best_ms if best_ms == best_ms else math.nan
        pct_goal = OP_SPECS[r.op].goal.pct
        misses = [what for what, missed in (("bandwidth", not r.pct_of_ceiling >= pct_goal),
                                            ("vs native/compile", slowdown > GOAL_SLOWDOWN)) if missed]
        rows.append({"target": r.target, "op": r.op, "impl": r.impl, "size": r.size, "dtype": r.dtype,
                     "GB/s": r.gbps, "% of ceiling": r.pct_of_ceiling, "goal %": pct_goal,
                     "% slower than best(native, compile)": 100 * (slowdown - 1),
                     "verdict": "missed: " + ", ".join(misses) if misses else "met"})
    return pd.DataFrame(rows)


def _goal_case(row: Any) -> bool:
    """Whether a row is one of its op's goal cells: a named shape and dtype, or a large enough input tensor."""
    goal = OP_SPECS[row.op].goal if row.op in OP_SPECS else None
    if goal is None:
        return False
    if goal.shapes:
        return str(row.size) in goal.shapes and (not goal.dtypes or row.dtype in goal.dtypes)
    return float(row.tensor_bytes) >= goal.min_bytes and (not goal.dtypes or row.dtype in goal.dtypes)


def op_figures(df: pd.DataFrame, ceilings: pd.DataFrame, op: str, target: str, label: str) -> list[plots.Figure]:
    mine = df[df["target"] == target]
    dtypes = [d for d in DTYPES if d in set(mine["dtype"])]
    pattern = OP_SPECS[op].pattern if op in OP_SPECS else "copy"
    lines: dict[str, dict[str, float]] = {}
    if not ceilings.empty and "best" in ceilings.columns:
        best = _ok(ceilings[(ceilings["target"] == target) & (ceilings["kind"] == pattern)])
        best = best[best["best"].astype(str).str.lower() == "true"]
        for dtype, rows in best.groupby("dtype"):
            top = rows.loc[pd.to_numeric(rows["tensor_bytes"]).idxmax()]
            lines[str(dtype)] = {f"{pattern} ceiling at the largest size": float(top["gbps"])}
    figures = []
    if not _ok(mine).empty:
        curve = _ok(mine).drop_duplicates(["size", "dtype"])
        curve = curve[curve["ceiling_gbps"].notna()] if "ceiling_gbps" in curve else curve.iloc[0:0]
        curve = curve.assign(impl=SAME_SIZE, gbps=curve.get("ceiling_gbps"), gbps_p10=math.nan,
                             gbps_p90=math.nan, median_ms=math.nan, pct_of_ceiling=math.nan, rel_err=math.nan)
        plotted = pd.concat([mine, curve], ignore_index=True) if not curve.empty else mine
        shape = op in OP_SPECS and OP_SPECS[op].ndim == 2
        figures.append(size_figure(
            plotted, y="gbps", hue="impl", col="dtype", facets=dtypes, ceilings=lines,
            ylow="gbps_p10", yhigh="gbps_p90", ylabel="GB/s (fewest bytes / median time)",
            xlabel="shape (rows × columns)" if shape else "elements per tensor",
            alt=f"{op}: achieved bandwidth against size per implementation and dtype on {label}, with the "
                f"measured {pattern} ceiling",
            caption=f"{label}. Shaded: GB/s at the p90 and p10 times. Dotted, '{SAME_SIZE}': the {pattern} "
                    "ceiling measured at each size, which '% of ceiling' is relative to (where a case beat every "
                    f"method at its size, the fastest case). Dashed: the {pattern} ceiling at the largest size; "
                    "where the dotted line is below half of it the size is latency-bound and has no '% of "
                    "ceiling'.",
            data_columns=["impl", "size", "dtype", "status", "median_ms", "p10_ms", "p90_ms", "cv", "reps", "stable",
                          "gbps", "pattern", "ceiling_gbps", "ceiling_bytes", "ceiling_method", "regime",
                          "pct_of_ceiling", "rel_err", "cold_call_ms", "throttled", "reason"]))
    ups = speedups(mine)
    ups = ups[ups["impl"] != BASELINE]
    if not ups.empty:
        order = [size_label(s) for s in _size_order(ups)]
        ups = ups.assign(size=pd.Categorical(ups["size"].astype(str).map(size_label), categories=order, ordered=True))
        figures.append(plots.ratio_heatmap(
            ups, index="size", columns="impl", values="speedup", col="dtype", facets=dtypes,
            label=f"{op}: speed-up over native (×, median time; above 1 is faster)",
            alt=f"{op}: heatmap of each implementation's speed-up over native per size and dtype on {label}",
            caption=f"{label}. Only cells whose output passed the correctness gate are shown."))
    return figures


def build(ctx: Any) -> dict[str, Any] | None:
    frames = {op: ctx.results.table(f"bench/{op}.csv") for op in OP_SPECS}
    frames = {op: df for op, df in frames.items() if not df.empty}
    if not frames:
        return None
    ceilings = ctx.results.table(CEILINGS.path)
    # Vector sizes read back as integers, softmax shapes as text: one type for the column.
    frames = {op: df.assign(size=df["size"].astype(str)) for op, df in frames.items()}
    targets = [t for t in ctx.results.targets if any(t in set(df["target"]) for df in frames.values())]
    if not any((ctx.devices.get(t) or {}).get("gpu_available") for t in targets):
        # No GPU, no throttling to report: the column only says so on every row.
        frames = {op: df.drop(columns=["throttled"], errors="ignore") for op, df in frames.items()}
        ceilings = ceilings.drop(columns=["throttled"], errors="ignore")
    labels = ctx.target_labels
    ops = []
    for op, df in frames.items():
        per_target = []
        for target in [t for t in targets if t in set(df["target"])]:
            mine = df[df["target"] == target]
            per_target.append({
                "name": target, "label": labels.get(target, target),
                "figures": op_figures(df, ceilings, op, target, labels.get(target, target)),
                "counts": mine["status"].value_counts().to_dict(),
                "sizes": ", ".join(size_label(s) for s in _size_order(mine)),
                "size_words": "elements per tensor" if mine["size"].str.isdigit().all() else "rows × columns",
            })
        ops.append({"op": op, "title": OP_SPECS[op].title, "pattern": OP_SPECS[op].pattern,
                    "formula": OP_SPECS[op].formula, "targets": per_target, "fastest": fastest(df),
                    "correctness": correctness(df), "problems": problems(df), "unsteady": unsteady(df)})
    everything = pd.concat(frames.values(), ignore_index=True)
    gpu_targets = [t for t in targets if (ctx.devices.get(t) or {}).get("gpu_available")]
    study = study_gelu(frames.get("gelu", pd.DataFrame()), targets)
    ours = study[[f"{t} (ms)" for t in targets]] if targets else pd.DataFrame()
    ceilings = with_regime(ceilings)
    ceiling_rows = ceilings[[c for c in ("target", "kind", "dtype", "size", "method", "best", "status", "gbps",
                                         "tflops", "regime", "median_ms", "cv", "reps", "stable", "throttled",
                                         "reason") if c in ceilings.columns]]
    return {
        "ops": ops,
        "study": study,
        "study_measured": bool(ours.notna().any().any()) if not ours.empty else False,
        "goals": goals(everything, gpu_targets),
        "above_ceiling": above_ceiling(everything),
        "gpu_targets": gpu_targets,
        "ceilings": ceiling_rows,
        "links": {t: ctx.link(ctx.results.path(t, "bench")) for t in targets},
    }
