"""Build: the toolchains found, the standalone HIP program, the PyTorch extension (build times and
correctness), and the tutorial's timing experiment next to a proper measurement."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter

from gpulab.native.timing_pitfalls import STUDY_MS, TUTORIAL_SIZE
from gpulab.report import plots
from gpulab.report.results import number

ORDER = 30
ID = "build"
TITLE = "Build: standalone HIP program and PyTorch extension"
TEMPLATE = "build.html.j2"

METHOD_LABELS = {
    "tutorial": "tutorial:\n1 cold call,\ncustom op first",
    "tutorial_reversed": "tutorial:\n1 cold call,\nx + y first",
    "measured": "measured:\nwarm-up, {timer},\nmedian",
}
TIMER_NAMES = {"device_event": "device events", "perf_counter": "host clock"}


def method_label(method: str, timer: object) -> str:
    """A bar's label; the measured one names the timer its rows used (device events only on a GPU)."""
    return METHOD_LABELS[method].format(timer=TIMER_NAMES.get(str(timer), str(timer)))


def _rows(df: pd.DataFrame, target: str) -> pd.DataFrame:
    if df.empty or "target" not in df.columns:
        return pd.DataFrame()
    return df[df["target"] == target].reset_index(drop=True)


def toolchain_table(standalone: pd.DataFrame, extension: pd.DataFrame) -> pd.DataFrame:
    """One row per build: what compiled what, for which arch, how long it took, and the outcome."""
    rows = []
    build = standalone[standalone["phase"] == "build"] if not standalone.empty else standalone
    for r in build.itertuples():
        rows.append({"build": "standalone vector_add", "compiler": f"{r.compiler or ''} {r.compiler_version or ''}"
                     .strip() if isinstance(r.compiler, str) else "", "arch": r.arch if isinstance(r.arch, str) else "",
                     "seconds": number(r.build_s), "cached": False, "status": r.status, "reason": r.reason})
    for r in (extension.itertuples() if not extension.empty else []):
        rows.append({"build": f"extension ({r.phase.replace('_', ' ')})",
                     "compiler": r.compiler if isinstance(r.compiler, str) else "",
                     "arch": r.arch if isinstance(r.arch, str) else "", "seconds": number(r.seconds),
                     "cached": bool(r.cached) if r.cached == r.cached else False, "status": r.status,
                     "reason": r.reason})
    return pd.DataFrame(rows, columns=["build", "compiler", "arch", "seconds", "cached", "status", "reason"])


def standalone_runs(standalone: pd.DataFrame) -> pd.DataFrame:
    if standalone.empty:
        return pd.DataFrame()
    runs = standalone[standalone["phase"] == "run"]
    columns = ["size", "status", "correct", "kernel_ms", "gbps", "p10_ms", "p90_ms", "reps", "first_call_ms",
               "reason"]
    return runs[[c for c in columns if c in runs.columns]].reset_index(drop=True)


def split_checks(checks: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(correctness rows, bad-input rows); tables written before the bad-input cases hold only the first."""
    if checks.empty or "kind" not in checks.columns:
        return checks, pd.DataFrame()
    return (checks[checks["kind"] != "bad_input"].reset_index(drop=True),
            checks[checks["kind"] == "bad_input"].reset_index(drop=True))


def bad_input_table(bad: pd.DataFrame) -> pd.DataFrame:
    """One row per bad-input case: what was passed, what the operator said, and whether that was right."""
    if bad.empty:
        return pd.DataFrame()
    table = bad[["op", "case", "layout", "dtype", "shape", "status", "message", "reason"]].copy()
    return table.fillna("")


def checks_summary(checks: pd.DataFrame) -> pd.DataFrame:
    """Per op and dtype: cases checked, how many were within tolerance, and the worst errors."""
    if checks.empty or "op" not in checks.columns or checks["op"].isna().all():
        return pd.DataFrame()
    grouped = checks.groupby(["op", "dtype", "device"], sort=True)
    return grouped.agg(cases=("status", "size"), within_tolerance=("status", lambda s: int((s == "ok").sum())),
                       worst_rel_err=("rel_err", "max"), worst_abs_err=("max_abs_err", "max"),
                       worst_diff_vs_pytorch=("max_abs_diff_native", "max")).reset_index()


def pitfalls_story(pit: pd.DataFrame) -> dict[str, Any] | None:
    """The numbers the explanation quotes: the tutorial's apparent speed-up and the measured one."""
    if pit.empty or not (pit["status"] == "ok").any():
        return None
    ok = pit[pit["status"] == "ok"]

    def ms(method: str, impl: str) -> float:
        hit = ok[(ok["method"] == method) & (ok["impl"] == impl)]
        return float(hit["ms"].iloc[0]) if not hit.empty else math.nan

    measured = ok[ok["method"] == "measured"]
    reps = int(measured["reps"].min()) if not measured.empty else 0
    story = {
        "tutorial_custom": ms("tutorial", "cpp_ext"), "tutorial_native": ms("tutorial", "native"),
        "reversed_custom": ms("tutorial_reversed", "cpp_ext"), "reversed_native": ms("tutorial_reversed", "native"),
        "measured_custom": ms("measured", "cpp_ext"), "measured_native": ms("measured", "native"),
        "reps": reps, "device": str(ok["device"].iloc[0]), "size": int(ok["size"].iloc[0]),
        "timer": str(measured["timer"].iloc[0]) if not measured.empty else "",
    }
    story["tutorial_speedup"] = story["tutorial_native"] / story["tutorial_custom"]
    story["reversed_speedup"] = story["reversed_native"] / story["reversed_custom"]
    story["measured_speedup"] = story["measured_native"] / story["measured_custom"]
    story["native_faster_pct"] = 100 * (story["measured_custom"] / story["measured_native"] - 1)
    return story


def pitfalls_figure(pit: pd.DataFrame, target: str) -> plots.Figure | None:
    ok = pit[pit["status"] == "ok"]
    if ok.empty:
        return None
    methods = [m for m in METHOD_LABELS if m in set(ok["method"])]
    impls = ["cpp_ext", "native"]
    colors = plots.series_colors(impls)
    fig, ax = plt.subplots(figsize=(plots.FIG_WIDTH_IN * 0.75, plots.PANEL_HEIGHT_IN))
    width = 0.38
    for i, impl in enumerate(impls):
        for j, method in enumerate(methods):
            cell = ok[(ok["method"] == method) & (ok["impl"] == impl)]
            if cell.empty:
                continue
            value = float(cell["ms"].iloc[0])
            pos = j - 0.2 + width * i
            ax.bar(pos, value, width=width * 0.92, color=colors[impl], label=impl if j == 0 else None, zorder=2)
            ax.annotate(f"{value:.3g}", (pos, value), ha="center", va="bottom", fontsize=plots.SMALL_PT, xytext=(0, 2),
                        textcoords="offset points")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 22, not 2.2x10^1
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    if high < 10 * low:  # within a decade only the minor ticks are labelled
        ax.yaxis.set_minor_formatter(plain)
    timers = {m: ok.loc[ok["method"] == m, "timer"].iloc[0] for m in methods}
    ax.set_xticks(range(len(methods)), [method_label(m, timers[m]) for m in methods], fontsize=plots.SMALL_PT)
    ax.set_ylabel("reported time (ms, log scale)")
    ax.set_title(target, loc="left")
    ax.legend(title="implementation", frameon=False)
    data = ok[["method", "impl", "call_order", "ms", "speedup_vs_native", "reps", "timer", "correct"]]
    return plots.embed(fig, f"Custom add vs x + y on {target}: the tutorial's cold single calls against the "
                            "median of properly timed repetitions", data=data)


def build(ctx: Any) -> dict[str, Any] | None:
    standalone = ctx.results.table("build/hip_standalone.csv")
    extension = ctx.results.table("build/extension.csv")
    checks = ctx.results.table("build/extension_checks.csv")
    pitfalls = ctx.results.table("build/timing_pitfalls.csv")
    frames = (standalone, extension, checks, pitfalls)
    present = [t for t in ctx.results.targets if any(not _rows(f, t).empty for f in frames)]
    if not present:
        return None
    labels = getattr(ctx, "target_labels", {}) or {}
    targets = []
    for target in present:
        sa, ext, all_checks, pit = (_rows(f, target) for f in frames)
        chk, bad = split_checks(all_checks)
        build_dir = ctx.results.path(target, "build")
        logs = [{"name": name, "href": ctx.link(path)}
                for name in ("hip_standalone_build.log", "hip_standalone_run.log", "extension_build.log")
                if (path := ctx.results.own(build_dir / name))]
        incorrect = chk[chk["status"] == "incorrect"] if not chk.empty else chk
        skipped_checks = chk[chk["status"] == "skipped"] if not chk.empty else chk
        targets.append({
            "name": target,
            "label": labels.get(target, target),
            "toolchains": toolchain_table(sa, ext),
            "runs": standalone_runs(sa),
            "run_skipped": (not sa.empty and (sa[sa["phase"] == "run"]["status"] == "skipped").all()),
            "run_reason": (sa[sa["phase"] == "run"]["reason"].iloc[0] if not sa.empty and
                           not sa[sa["phase"] == "run"].empty else ""),
            "command": (sa[sa["phase"] == "build"]["command"].iloc[0] if not sa.empty and "command" in sa and
                        isinstance(sa[sa["phase"] == "build"]["command"].iloc[0], str) else ""),
            "checks": checks_summary(chk),
            "checks_total": len(chk) if not chk.empty else 0,
            "checks_ok": int((chk["status"] == "ok").sum()) if not chk.empty else 0,
            "checks_skipped_reason": skipped_checks["reason"].iloc[0] if not skipped_checks.empty else "",
            "bad_inputs": bad_input_table(bad),
            "bad_inputs_ok": int((bad["status"] == "ok").sum()) if not bad.empty else 0,
            "bad_inputs_run": int((bad["status"] != "skipped").sum()) if not bad.empty else 0,
            "incorrect": incorrect[[c for c in ("op", "dtype", "shape", "layout", "max_abs_err", "rel_err", "reason")
                                    if c in incorrect.columns]] if not incorrect.empty else pd.DataFrame(),
            "story": pitfalls_story(pit) if not pit.empty else None,
            "pitfalls_reason": (pit["reason"].iloc[0] if not pit.empty and (pit["status"] != "ok").all() else ""),
            "pitfalls_figure": pitfalls_figure(pit, labels.get(target, target)) if not pit.empty else None,
            "pitfalls": pit,
            "logs": logs,
        })
    return {"targets": targets, "study_ms": STUDY_MS, "tutorial_size": TUTORIAL_SIZE}
