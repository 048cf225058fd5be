"""MLP profile: step time and TFLOP/s per precision variant against the matmul ceiling, where the
device time goes (top kernels, forward vs backward; GEMM vs elementwise), memory, and the traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from gpulab.core.kernel_trace import CATEGORIES, HOST_BOUND_SHARE, PHASES, short_kernel_name
from gpulab.report import findings, plots

ORDER = 50
ID = "mlp"
TITLE = "MLP profile"
TEMPLATE = "mlp.html.j2"

TOP_KERNELS = 8
GIB = 2**30


def _variant_order(names: pd.Series) -> list[str]:
    return plots.series_order(names.dropna().astype(str).unique())


def top_kernels(kernels: pd.DataFrame, n: int = TOP_KERNELS) -> pd.DataFrame:
    """Per variant, the ``n`` kernels with the most time per step, split by phase (ms per step)."""
    if kernels.empty:
        return pd.DataFrame(columns=["variant", "kernel", "label", "phase", "ms_per_step"])
    per_kernel = kernels.groupby(["variant", "kernel"], as_index=False)["time_per_step_us"].sum()
    ranked = per_kernel.sort_values("time_per_step_us", ascending=False).groupby("variant").head(n)
    keep = kernels.merge(ranked[["variant", "kernel"]], on=["variant", "kernel"])
    out = keep.groupby(["variant", "kernel", "phase"], as_index=False)["time_per_step_us"].sum()
    out["ms_per_step"] = out.pop("time_per_step_us") / 1e3
    out["label"] = out["kernel"].map(lambda name: short_kernel_name(name, width=56))
    return out[["variant", "kernel", "label", "phase", "ms_per_step"]]


def category_shares(kernels: pd.DataFrame) -> pd.DataFrame:
    """Share of each variant's kernel time per category (matmul / activation / reduction / other)."""
    if kernels.empty:
        return pd.DataFrame(columns=["variant", *CATEGORIES])
    grid = kernels.pivot_table(index="variant", columns="category", values="share", aggfunc="sum", fill_value=0.0)
    grid = grid.reindex(columns=list(CATEGORIES), fill_value=0.0)
    grid = grid.reindex([v for v in _variant_order(kernels["variant"]) if v in grid.index])
    return grid.reset_index()


def top_kernels_figure(top: pd.DataFrame, unit: str, label: str) -> plots.Figure:
    """One row per variant on a shared time axis, so the GEMM time each precision saves is visible."""
    variants = _variant_order(top["variant"])
    heights = [max(1.0, 0.24 * top[top["variant"] == v]["label"].nunique()) + 0.6 for v in variants]
    fig, axes = plt.subplots(len(variants), 1, figsize=(plots.FIG_WIDTH_IN, sum(heights) + 0.6), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    colors = plots.series_colors(PHASES)
    for ax, variant in zip(axes[:, 0], variants, strict=True):
        part = top[top["variant"] == variant]
        grid = part.pivot_table(index="label", columns="phase", values="ms_per_step", aggfunc="sum", fill_value=0.0)
        grid = grid.reindex(columns=[p for p in PHASES if p in grid.columns])
        grid = grid.loc[grid.sum(axis=1).sort_values().index]
        left = pd.Series(0.0, index=grid.index)
        for phase in grid.columns:
            ax.barh(grid.index, grid[phase], left=left, color=colors[phase], label=phase, height=0.7)
            left += grid[phase]
        ax.set_title(variant, loc="left")
        ax.tick_params(axis="y", labelsize=plots.SMALL_PT)
    axes[-1, 0].set_xlabel(unit)
    handles, labels = [], []
    for ax in axes[:, 0]:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in labels:
                handles.append(handle)
                labels.append(text)
    fig.legend(handles, labels, title="phase", loc="upper center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
    return plots.embed(fig, f"Top {TOP_KERNELS} kernels by {label} per variant, stacked forward/backward",
                       data=top.drop(columns=["kernel"]))


def shares_figure(shares: pd.DataFrame, label: str) -> plots.Figure:
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(shares) + 1.3))
    colors = plots.series_colors(CATEGORIES)
    left = pd.Series(0.0, index=shares.index)
    for category in CATEGORIES:
        values = shares[category] * 100
        ax.barh(shares["variant"], values, left=left, color=colors[category], label=category, height=0.6)
        for y, (start, width) in enumerate(zip(left, values, strict=True)):
            if width >= 7:
                ax.text(start + width / 2, y, f"{width:.0f}%", ha="center", va="center", fontsize=plots.SMALL_PT)
        left += values
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"share of {label} (%)")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(shares) < 3 else -0.2), ncol=4, frameon=False)
    fig.tight_layout()
    return plots.embed(fig, f"Share of {label} in GEMM, elementwise activation, reduction and data-movement kernels",
                       data=shares)


def host_bound_labels(summary: pd.DataFrame) -> list[str]:
    """'host-bound' where the device spent under HOST_BOUND_SHARE of the step in kernels, 'device' where it
    spent more, '–' where unknown (CPU-only runs, variants not profiled)."""
    flags = summary.get("host_bound", pd.Series([pd.NA] * len(summary), index=summary.index))
    labels = []
    for flag in flags:
        if pd.isna(flag):
            labels.append("–")
        else:
            labels.append("host-bound" if str(flag).strip().lower() in ("true", "1") else "device")
    return labels


def summary_table(summary: pd.DataFrame, unit: findings.Unit) -> pd.DataFrame:
    rate = pd.to_numeric(summary.get("tflops"), errors="coerce") * unit.scale
    ceiling = pd.to_numeric(summary.get("ceiling_tflops"), errors="coerce") * unit.scale
    table = pd.DataFrame({
        "variant": summary["variant"],
        "status": summary["status"],
        "step (ms, median)": summary.get("median_ms"),
        "p10–p90 (ms)": [
            "–" if pd.isna(lo) else f"{lo:.3g}–{hi:.3g}"
            for lo, hi in zip(summary.get("p10_ms"), summary.get("p90_ms"), strict=True)
        ],
        "kernel time / step (ms)": summary.get("profiled_ms_per_step"),
        "kernel time / step time (%)": pd.to_numeric(summary.get("kernel_step_share"), errors="coerce") * 100,
        "bound": host_bound_labels(summary),
        unit.name: rate,
        f"ceiling ({unit.name})": ceiling,
        "ceiling dtype": summary.get("ceiling_dtype"),
        "% of ceiling": summary.get("pct_of_ceiling"),
        "GEMM share (%)": pd.to_numeric(summary.get("matmul_share"), errors="coerce") * 100,
        "rel. error (out / grad)": [
            "–" if pd.isna(o) else f"{o:.2g} / {g:.2g}"
            for o, g in zip(summary.get("rel_err_output"), summary.get("rel_err_grad"), strict=True)
        ],
        "peak allocated (GiB)": pd.to_numeric(summary.get("max_memory_allocated_bytes"), errors="coerce") / GIB,
        "peak reserved (GiB)": pd.to_numeric(summary.get("max_memory_reserved_bytes"), errors="coerce") / GIB,
        "first call (ms)": summary.get("first_call_ms"),
        "reason": summary["reason"],
    })
    return table


def _profile_files(ctx: Any, rows: pd.DataFrame, mlp_dir: Path) -> list[dict[str, Any]]:
    """Per variant its trace and flame-graph stacks, linked when the variant was profiled."""
    files = []
    for row in rows.itertuples():
        trace, stacks = (ctx.results.own_file(row.target, getattr(row, c), under="mlp",
                                              cell=f"{row.target}/mlp/summary.csv: {c} of {row.variant}")
                         if row.status == "ok" and isinstance(getattr(row, c), str) else None
                         for c in ("trace", "stacks"))
        files.append({
            "variant": row.variant, "status": row.status, "reason": row.reason,
            "trace": ctx.link(trace) if trace else None, "trace_name": Path(str(row.trace)).name,
            "stacks": ctx.link(stacks) if stacks else None, "stacks_name": Path(str(row.stacks)).name,
        })
    return files


def _top_kernel_rows(kernels: pd.DataFrame) -> pd.DataFrame:
    """The 15 longest kernels of each variant, names shortened for the table."""
    if kernels.empty:
        return pd.DataFrame()
    rows = (kernels.sort_values(["variant", "time_us"], ascending=[True, False]).groupby("variant")
            .head(15)[["variant", "phase", "category", "kernel", "launched_by", "calls", "time_per_step_us", "share"]])
    rows["kernel"] = rows["kernel"].map(lambda name: short_kernel_name(name, width=90))
    return rows


def build(ctx: Any) -> dict[str, Any] | None:
    summary = ctx.results.table("mlp/summary.csv")
    if summary.empty:
        return None
    kernels = ctx.results.table("mlp/kernels.csv")
    targets = []
    rate_unit = findings.flop_unit(ctx.results)
    for target in [t for t in ctx.results.targets if t in set(summary["target"])]:
        rows = summary[summary["target"] == target].copy()
        rows = rows.set_index("variant").loc[_variant_order(rows["variant"])].reset_index()
        first = rows.iloc[0]
        cpu_only = str(first.get("time_source")) == "cpu_op_self"
        label = "CPU op self time" if cpu_only else "device kernel time"
        unit = f"ms per step ({label})"
        mine = kernels[kernels["target"] == target] if not kernels.empty else kernels
        figures = []
        if not mine.empty:
            figures.append(top_kernels_figure(top_kernels(mine), unit, label))
            figures.append(shares_figure(category_shares(mine), label))
        mlp_dir = ctx.results.path(target, "mlp")
        files = _profile_files(ctx, rows, mlp_dir)
        kernel_rows = _top_kernel_rows(mine)
        targets.append({
            "name": target,
            "label": ctx.target_labels.get(target, target) if hasattr(ctx, "target_labels") else target,
            "cpu_only": cpu_only,
            "activities": first.get("activities"),
            "shape": {k: first.get(k) for k in ("dim", "num_layers", "batch", "profiled_steps")},
            "flops": first.get("step_matmul_flops"),
            "table": summary_table(rows, rate_unit),
            "figures": figures,
            "files": files,
            "kernels": kernel_rows,
            "ops_link": ctx.link(p) if (p := ctx.results.own(mlp_dir / "ops.csv")) else None,
            "kernels_link": ctx.link(p) if (p := ctx.results.own(mlp_dir / "kernels.csv")) else None,
        })
    step_fig = plots.bars_by_target(
        summary, x="variant", y="median_ms", ylabel="time per forward+backward step (ms)",
        alt="Median step time per MLP variant and target", err_low="p10_ms", err_high="p90_ms",
        facet_titles=getattr(ctx, "target_labels", None),
        data_columns=["target", "variant", "status", "median_ms", "p10_ms", "p90_ms", "reps", "timer"])
    rates = summary.assign(rate=pd.to_numeric(summary["tflops"], errors="coerce") * rate_unit.scale,
                           ceiling=pd.to_numeric(summary["ceiling_tflops"], errors="coerce") * rate_unit.scale)
    tflops_fig = plots.bars_by_target(
        rates, x="variant", y="rate", ylabel=f"matmul {rate_unit.name} (fwd+bwd)",
        alt=f"Achieved matmul {rate_unit.name} per MLP variant against the measured matmul ceiling of its dtype",
        ceiling_col="ceiling", ceiling_label="measured matmul ceiling (variant's dtype)",
        facet_titles=getattr(ctx, "target_labels", None),
        data_columns=["target", "variant", "status", "tflops", "ceiling_dtype", "ceiling_tflops", "pct_of_ceiling"])
    return {"targets": targets, "step_fig": step_fig, "tflops_fig": tflops_fig,
            "above": findings.above_ceiling_in(ctx.results, "mlp/"),
            "host_bound_pct": round(100 * HOST_BOUND_SHARE)}
