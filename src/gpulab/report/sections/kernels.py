"""Kernels across architectures: every kernel compiled for the study's iGPU, AMD datacentre GPUs and
NVIDIA, with registers, spills and occupancy; measured GB/s beside them where a target ran the kernel."""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.core.ops import OPS
from gpulab.report import findings, plots
from gpulab.toolchains.archs import ARCHS

ORDER = 45
ID = "kernels"
TITLE = "Kernels across architectures"
TEMPLATE = "kernels.html.j2"

ARCH_ORDER = list(ARCHS)
STUDY_ARCH = "gfx1151"


def kernel_label(df: pd.DataFrame) -> pd.Series:
    """Heatmap row names: the kernel without namespaces and template arguments (one row covers all of a
    template's instantiations), marked with its compiler for HIP C++ ones: (clang) or (hipcc)."""
    compiler = df["compiler"].fillna("").str.split().str[0]
    hip = compiler.isin(["clang", "hipcc"])
    base = df["kernel"].fillna("").str.replace(r"<.*$", "", regex=True).str.replace(r"^.*::", "", regex=True)
    return base + (" (" + compiler + ")").where(hip, "")


def representative(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """The static figures do not depend on the machine that compiled them: one target's table (the one
    with the most compiled rows) stands for all."""
    counts = table[table["status"] == "ok"].groupby("target").size()
    target = str(counts.idxmax()) if not counts.empty else str(table["target"].iloc[0])
    return target, table[table["target"] == target].copy()


def per_kernel_arch(ok: pd.DataFrame) -> pd.DataFrame:
    """Per kernel x arch over all its launch configurations and dtypes: the worst case of each figure."""
    grouped = ok.assign(kernel=kernel_label(ok)).groupby(["kernel", "arch"], sort=False)
    return grouped.agg(
        launches=("status", "size"), registers_min=("registers", "min"), registers_max=("registers", "max"),
        spilled_regs=("spilled_regs", "max"), scratch_bytes=("scratch_bytes", "max"),
        lds_bytes_max=("lds_bytes", "max"), occupancy_min=("occupancy", "min"),
        compile_s_total=("compile_s", "sum"),
    ).reset_index()


def figures(summary: pd.DataFrame, target: str) -> list[plots.Figure]:
    occ = plots.value_heatmap(
        summary, index="kernel", columns="arch", values="occupancy_min", column_order=ARCH_ORDER, vmin=0, vmax=1,
        fmt="{:.2f}", label="lowest occupancy over launches",
        alt="Heatmap of the lowest occupancy of each kernel on each architecture",
        caption=f"Resident warps (waves) per SM/CU/WGP as a fraction of the architecture's maximum, the worst "
                f"launch configuration and dtype of each kernel (compiled on target {target}).")
    spills = plots.value_heatmap(
        summary, index="kernel", columns="arch", values="spilled_regs", column_order=ARCH_ORDER, vmin=0,
        vmax=max(1.0, float(summary["spilled_regs"].max())),
        fmt="{:.0f}", cmap="rocket_r", label="registers spilled (worst launch)",
        alt="Heatmap of the most registers any launch of each kernel spills on each architecture",
        caption="Registers spilled to scratch memory by the worst launch of each kernel (AMD: VGPR+SGPR spill "
                "counts; NVIDIA: ptxas spill-store bytes / 4). Zero everywhere means every launch fits in registers.")
    return [occ, spills]


def target_arch(ctx: Any, target: str) -> str | None:
    env = ctx.results.env(target) or {}
    return (env.get("device") or {}).get("arch")


def measured_beside_static(ctx: Any, static: pd.DataFrame) -> pd.DataFrame:
    """Per target that ran the Triton kernels on a listed arch: its best GB/s per op and dtype, beside the
    static figures of that op's launches compiled for the same arch."""
    rows = []
    for target in ctx.results.targets:
        arch = target_arch(ctx, target)
        if arch not in ARCHS:
            continue
        for op in OPS:
            bench = ctx.results.table(f"bench/{op}.csv")
            if bench.empty:
                continue
            ran = bench[(bench["target"] == target) & (bench["impl"] == "triton") & (bench["status"] == "ok")]
            for dtype, cell in ran.groupby("dtype"):
                best = cell.loc[cell["gbps"].idxmax()]
                comp = static[(static["arch"] == arch) & (static["op"] == op) & (static["dtype"] == dtype)
                              & static["compiler"].str.startswith("triton")]
                if comp.empty:
                    continue
                rows.append({"target": target, "arch": arch, "op": op, "dtype": dtype,
                             "best_gbps": best["gbps"], "pct_of_copy_bw": best.get("pct_of_copy_bw"),
                             "at_size": best["size"], "launches": len(comp),
                             "registers": _span(comp["registers"]), "spilled_regs_max": comp["spilled_regs"].max(),
                             "occupancy_min": comp["occupancy"].min()})
    return pd.DataFrame(rows)


def _span(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return ""
    low, high = int(values.min()), int(values.max())
    return str(low) if low == high else f"{low}–{high}"


def not_ok(table: pd.DataFrame) -> pd.DataFrame:
    """Compiles that are not ok, one line per reason with how many it covers (a reason is written once)."""
    bad = table[table["status"] != "ok"]
    return findings.grouped_reasons(bad, ("target", "status", "reason"),
                                    ("arch", "compiler", "source", "kernel", "dtype"))


def build(ctx: Any) -> dict[str, Any] | None:
    table = ctx.results.table("build/kernel_resources.csv")
    if table.empty:
        return None
    target, static = representative(table)
    ok = static[static["status"] == "ok"]
    summary = per_kernel_arch(ok) if not ok.empty else pd.DataFrame()
    archs = [{"name": a.name, "device": a.device, "family": a.family, "warp_size": a.warp_size, "unit": a.unit,
              "max_warps": a.max_warps_per_unit} for a in ARCHS.values()]
    study = ok[ok["arch"] == STUDY_ARCH]
    return {
        "target": target,
        "compilers": sorted(static["compiler"].dropna().unique()),
        "archs": pd.DataFrame(archs),
        "counts": static.groupby(["arch", "status"]).size().unstack(fill_value=0).reindex(
            [a for a in ARCH_ORDER if a in set(static["arch"])]).reset_index(),
        "figures": figures(summary, target) if not summary.empty else [],
        "summary": summary,
        "study_min_occupancy": float(study["occupancy"].min()) if not study.empty else None,
        "study_spills": int(study["spilled_regs"].max()) if not study.empty else None,
        "measured": measured_beside_static(ctx, static),
        "not_ok": not_ok(static),
        "table": static.drop(columns=["fingerprint"]),
    }
