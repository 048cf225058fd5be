"""One plotting style for every figure, and figures embedded as data URIs (no external files).

Sections build figures through the helpers here so that every plot in the report reads the same way:
seaborn's colour-blind-safe palette with one fixed colour per implementation/variant/engine across all
figures, axes labelled with units, measured ceilings as dashed lines, one panel per target side by side
(same y axis, so targets compare at a glance), and the data behind the figure kept with it
(:class:`Figure` ``.data``, shown collapsed beneath the image by the ``figure`` macro).
"""

from __future__ import annotations

import base64
import io
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: the report renders on servers and in CI

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import TwoSlopeNorm
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from PIL import Image

from gpulab.bench.impls import in_colour_order

PALETTE = "colorblind"
FIG_WIDTH_IN = 10.0
PANEL_HEIGHT_IN = 3.6
MAX_PANELS_PER_ROW = 3
DPI = 110

# Names that recur across sections get the same colour everywhere (the baseline first, in the palette's
# most neutral slots); unknown names take the next free colours in sorted order.
KNOWN_SERIES = (
    *in_colour_order(),  # bench implementations
    "fp32", "tf32", "bf16", "compiled", "fp16",  # MLP variants / dtypes
    "hf", "fast",  # LLM engines
)
CEILING_COLOR = "#222222"
# The smallest text in any figure, in points: shown at 100 dpi that is 14 CSS px (digits about 10 px tall).
SMALL_PT = 10
ABOVE_COLOR = "#c0392b"


@dataclass(frozen=True)
class Figure:
    """An embedded image plus what the page shows with it."""

    uri: str
    alt: str
    width: int
    height: int
    caption: str = ""
    data: pd.DataFrame | None = field(default=None, compare=False)
    smallest_text_pt: float = math.nan  # the smallest visible text drawn in it (SMALL_PT at least)


def apply_style() -> None:
    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    plt.rcParams.update({
        "figure.dpi": 100, "savefig.dpi": DPI, "axes.titleweight": "bold", "axes.titlesize": 12,
        "axes.labelsize": 11, "xtick.labelsize": SMALL_PT, "ytick.labelsize": SMALL_PT, "legend.fontsize": SMALL_PT,
        "legend.title_fontsize": SMALL_PT + 1, "font.size": SMALL_PT,
        "figure.autolayout": False, "svg.fonttype": "none",
    })


def _png_bytes(fig: plt.Figure) -> tuple[bytes, int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", facecolor="white")
    plt.close(fig)
    # Plots use few colours: an adaptive 256-colour palette keeps them visually identical at about a
    # third of the size, which keeps a full report well under its 5 MB budget.
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    small = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue(), image.width, image.height


def smallest_text(fig: plt.Figure) -> float:
    """Font size (pt) of the smallest visible, non-empty text of the figure."""
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and t.get_figure() is fig]
    return float(min(sizes)) if sizes else math.nan


def embed(fig: plt.Figure, alt: str, caption: str = "", data: pd.DataFrame | None = None) -> Figure:
    """Close the matplotlib figure and keep it as an embedded :class:`Figure` (image, text, data)."""
    smallest = smallest_text(fig)
    png, width, height = _png_bytes(fig)
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    # Saved at DPI but shown at CSS pixels of a 100-dpi screen: sharp on high-density displays and print.
    scale = 100 / DPI
    return Figure(uri, alt, round(width * scale), round(height * scale), caption, data, smallest)


def draw_ceiling(ax: plt.Axes, value: float, label: str, color: str = CEILING_COLOR) -> None:
    """Ceilings are dashed horizontal lines with their value in the label."""
    if value is not None and not (isinstance(value, float) and math.isnan(value)) and value > 0:
        ax.axhline(value, linestyle="--", linewidth=1.2, color=color, label=label, zorder=1)


def series_colors(names: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """A fixed colour per series name: known names keep their slot in every figure of the report."""
    palette = sns.color_palette(PALETTE, 10)
    names = list(dict.fromkeys(str(n) for n in names))
    colors: dict[str, tuple[float, float, float]] = {}
    used: set[int] = set()
    for name in names:
        if name in KNOWN_SERIES:
            slot = KNOWN_SERIES.index(name) % len(palette)
            colors[name] = palette[slot]
            used.add(slot)
    free = [i for i in range(len(palette)) if i not in used] or list(range(len(palette)))
    for i, name in enumerate(sorted(n for n in names if n not in colors)):
        colors[name] = palette[free[i % len(free)]]
    return colors


def series_order(names: Iterable[str]) -> list[str]:
    """Known names in the project's order (baseline first), then the rest sorted."""
    names = list(dict.fromkeys(str(n) for n in names))
    known = [n for n in KNOWN_SERIES if n in names]
    return known + sorted(n for n in names if n not in KNOWN_SERIES)


def format_bytes(value: float, _pos: int | None = None) -> str:
    """Axis tick for byte counts in binary units (4 KiB, 256 MiB, 2 GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} B"


def format_count(value: float, _pos: int | None = None) -> str:
    """Axis tick for element counts (98k, 16M, 1G: decimal SI prefixes)."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:g}"


X_FORMATS = {"bytes": format_bytes, "count": format_count}
MAX_X_TICKS = 7


def _size_ticks(ax: plt.Axes, values: Iterable[float], xformat: str | None, logx: bool) -> None:
    """Ticks at the sizes actually measured (thinned evenly in log space when there are many), so a
    reader sees "98.4k, 1.05M, 4.19M" instead of decades no row was run at."""
    xs = sorted({float(v) for v in values if v is not None and np.isfinite(v) and (v > 0 or not logx)})
    if not xs:
        return
    if len(xs) > MAX_X_TICKS:
        idx = np.unique(np.round(np.linspace(0, len(xs) - 1, MAX_X_TICKS)).astype(int))
        xs = [xs[i] for i in idx]
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_minor_locator(NullLocator())
    formatter = X_FORMATS.get(xformat or "", lambda v, _p=None: f"{v:g}")
    ax.xaxis.set_major_formatter(FuncFormatter(formatter))
    if len(xs) > 4:
        ax.tick_params(axis="x", labelrotation=30)


def panels(n: int, height: float = PANEL_HEIGHT_IN, sharey: bool = True,
           per_row: int | None = None) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``n`` panels, at most ``per_row`` (else MAX_PANELS_PER_ROW) a row; the unused ones hidden."""
    cols = min(max(n, 1), per_row or MAX_PANELS_PER_ROW)
    rows = math.ceil(max(n, 1) / cols)
    width = FIG_WIDTH_IN if cols > 1 else min(FIG_WIDTH_IN, 7.5)
    fig, axes = plt.subplots(rows, cols, figsize=(width, height * rows), sharey=sharey, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n] if n else flat[:1]


SHARED_SCALE_MAX_RATIO = 10.0


def _share_y(data: pd.DataFrame, y: str, col: str | None, row: str | None = None) -> bool:
    """One y scale for all panels when their largest values are within 10x of each other (an AMD and
    an NVIDIA GPU compare at a glance); otherwise each panel gets its own scale, or a CPU's bars next
    to a GPU's would be flat lines (values are annotated, so nothing is lost)."""
    groups = [c for c in (row, col) if c and c in data.columns]
    if not groups or y not in data.columns:
        return True
    peaks = pd.to_numeric(data[y], errors="coerce").groupby([data[c].astype(str) for c in groups]).max()
    peaks = peaks[peaks > 0]
    return peaks.empty or float(peaks.max() / peaks.min()) <= SHARED_SCALE_MAX_RATIO


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _facets(df: pd.DataFrame, col: str | None, facets: Sequence[str] | None) -> list[str | None]:
    if col is None or col not in df.columns:
        return [None]
    return list(facets) if facets is not None else sorted(df[col].dropna().astype(str).unique())


def shared_legend(fig: plt.Figure, axes: Sequence[plt.Axes], title: str | None) -> None:
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), title=title, loc="upper center",
                   bbox_to_anchor=(0.5, 1.0), ncol=min(len(handles), 6), frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    else:
        fig.tight_layout()


def _facet_title(ax: plt.Axes, facet: str | None, titles: Mapping[str, str] | None, empty: bool) -> None:
    if facet is None:
        return
    title = (titles or {}).get(facet, facet)
    ax.set_title(title + (" (no ok rows)" if empty else ""))


def _ceiling_lines(ax: plt.Axes, ceilings: Mapping[Any, Mapping[str, float]] | None, *keys: Any) -> None:
    """Lines of the first key ``ceilings`` has (e.g. ``(target, dtype)``, then ``dtype``, then ``target``)."""
    lines: Mapping[str, float] = {}
    for key in keys:
        if ceilings and key is not None and key in ceilings:
            lines = ceilings[key]
            break
    styles = ["--", ":", "-."]
    for i, (label, value) in enumerate(lines.items()):
        if value is None or (isinstance(value, float) and math.isnan(value)) or value <= 0:
            continue
        ax.axhline(value, linestyle=styles[i % len(styles)], linewidth=1.2, color=CEILING_COLOR, label=label,
                   zorder=1)


# Over 50 lines only for its keyword options, one a line as ruff formats them; the body is short.
def metric_vs_size(
    df: pd.DataFrame,
    *,
    x: str,
    y: str,
    hue: str,
    xlabel: str,
    ylabel: str,
    alt: str,
    caption: str = "",
    col: str | None = "target",
    facets: Sequence[str] | None = None,
    facet_titles: Mapping[str, str] | None = None,
    ceilings: Mapping[Any, Mapping[str, float]] | None = None,
    row: str | None = None,
    rows: Sequence[str] | None = None,
    ylow: str | None = None,
    yhigh: str | None = None,
    xformat: str | None = "count",
    logx: bool = True,
    logy: bool = False,
    style: str | None = None,
    data_columns: Sequence[str] | None = None,
) -> Figure:
    """A metric against problem size, one line per ``hue`` (e.g. implementation), one panel per target.

    ``row`` adds a second facet dimension (e.g. ``row="target", col="dtype"``: one row of panels per
    target, all on one y scale). ``ceilings`` maps a panel to ``{label: value}`` lines drawn dashed in it
    (e.g. the measured copy bandwidth), keyed by ``(row value, col value)``, the col value or the row
    value. ``ylow``/``yhigh`` (e.g. GB/s at the p90/p10 time) shade the measured spread. Only ``ok``
    rows are plotted; the data table keeps every row with its status.
    """
    data = _ok(df)
    col_values = _facets(df, col, facets)
    row_values = _facets(df, row, rows) if row else [None]
    grid = [(r, c) for r in row_values for c in col_values]
    colors = series_colors(df[hue].dropna().astype(str)) if hue in df.columns else {}
    fig, axes = panels(len(grid), per_row=len(col_values) if row else None,
                       sharey=logy or _share_y(data, yhigh or y, col, row))
    for ax, (row_value, facet) in zip(axes, grid, strict=False):
        part = data if facet is None else data[data[col].astype(str) == facet]
        if row_value is not None:
            part = part[part[row].astype(str) == row_value]
        _lines(ax, part, x, y, hue, style, (ylow, yhigh), colors)
        _ceiling_lines(ax, ceilings, (row_value, facet), facet, row_value)
        if logx:
            ax.set_xscale("log", base=2 if xformat == "bytes" else 10)
        if logy:
            ax.set_yscale("log")
        _size_ticks(ax, pd.to_numeric(part[x], errors="coerce") if x in part else [], xformat, logx)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _facet_title(ax, facet, facet_titles, part.empty)
        if row_value is not None:
            title = (facet_titles or {}).get(row_value, row_value)
            ax.set_title(f"{title} · {facet}" if facet is not None else title, fontsize=SMALL_PT)
    # Only once every panel is drawn: set_ylim stops autoscaling, and on shared axes an earlier call froze
    # the scale at the first panel's data (later panels' lines ran off the top).
    for ax in axes:
        ax.set_ylim(bottom=0 if not logy else None)
    shared_legend(fig, axes, hue)
    columns = [c for c in (data_columns or []) if c in df.columns] or None
    return embed(fig, alt, caption, df[columns] if columns else df)


def _lines(ax: plt.Axes, part: pd.DataFrame, x: str, y: str, hue: str, style: str | None,
           spread: tuple[str | None, str | None], colors: Mapping[str, Any]) -> None:
    """One line per ``hue`` value (and ``style`` value), each with its shaded spread when given."""
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    ylow, yhigh = spread
    for i, name in enumerate(series_order(part[hue].dropna().astype(str).unique()) if hue in part else []):
        line = part[part[hue].astype(str) == name]
        groups = [("", line)] if style is None else [(f" {s}", g) for s, g in line.groupby(style, sort=True)]
        for j, (suffix, group) in enumerate(groups):
            group = group.sort_values(x)
            ax.plot(group[x], group[y], marker=markers[i % len(markers)], markersize=4, linewidth=1.6,
                    linestyle=["-", "--", ":", "-."][j % 4], color=colors[name], label=f"{name}{suffix}")
            if ylow and yhigh and ylow in group and yhigh in group:
                ax.fill_between(group[x], group[ylow], group[yhigh], color=colors[name], alpha=0.18, linewidth=0)


# Over 50 lines only for its keyword options, one a line as ruff formats them; the body is short.
def bars_by_target(
    df: pd.DataFrame,
    *,
    x: str,
    y: str,
    ylabel: str,
    alt: str,
    hue: str | None = None,
    caption: str = "",
    col: str | None = "target",
    facets: Sequence[str] | None = None,
    facet_titles: Mapping[str, str] | None = None,
    ceilings: Mapping[Any, Mapping[str, float]] | None = None,
    ceiling_col: str | None = None,
    ceiling_label: str = "ceiling",
    err_low: str | None = None,
    err_high: str | None = None,
    value_format: str = "{:.3g}",
    data_columns: Sequence[str] | None = None,
) -> Figure:
    """Bars of a metric per category (``x``, optionally split by ``hue``), one panel per target.

    ``ceilings`` draws per-target dashed lines across a panel; ``ceiling_col`` instead marks a per-bar
    ceiling (e.g. the matmul rate of that bar's dtype) as a short dash above the bar. ``err_low`` /
    ``err_high`` give the error bar's ends (absolute values, e.g. mean - sd and mean + sd).
    """
    data = _ok(df)
    facet_values = _facets(df, col, facets)
    categories = series_order(data[x].dropna().astype(str).unique()) if x in data else []
    hues = series_order(data[hue].dropna().astype(str).unique()) if hue and hue in data else [None]
    colors = series_colors(hues if hue else categories)
    fig, axes = panels(len(facet_values), height=PANEL_HEIGHT_IN, sharey=_share_y(data, err_high or y, col))
    width = 0.8 / len(hues)
    for ax, facet in zip(axes, facet_values, strict=False):
        part = data if facet is None else data[data[col].astype(str) == facet]
        shown = [c for c in categories if c in set(part[x].astype(str))] or categories  # no empty slots
        for h_i, h in enumerate(hues):
            rows = part if h is None else part[part[hue].astype(str) == h]
            for c_i, cat in enumerate(shown):
                cell = rows[rows[x].astype(str) == cat]
                if cell.empty:
                    continue
                value = float(cell[y].iloc[0])
                pos = c_i - 0.4 + width * (h_i + 0.5)
                ax.bar(pos, value, width=width * 0.92, color=colors[h if h is not None else cat], label=h, zorder=2)
                _bar_marks(ax, cell, pos, width, value, (err_low, err_high), (ceiling_col, ceiling_label))
                _bar_value(ax, cell, pos, value, value_format, ceiling_col)
        _ceiling_lines(ax, ceilings, facet)
        ax.set_xticks(range(len(shown)), [textwrap.fill(c, 18) for c in shown])
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.margins(y=0.12)
        _facet_title(ax, facet, facet_titles, part.empty)
    shared_legend(fig, axes, hue)
    columns = [c for c in (data_columns or []) if c in df.columns] or None
    return embed(fig, alt, caption, df[columns] if columns else df)


def _bar_value(ax: plt.Axes, cell: pd.DataFrame, pos: float, value: float, value_format: str,
               ceiling_col: str | None) -> None:
    """The bar's value above it; in red and said so where the bar is above its own ceiling."""
    top = float(cell[ceiling_col].iloc[0]) if ceiling_col and ceiling_col in cell else math.nan
    above = value > top  # NaN compares false
    ax.annotate(value_format.format(value) + (" above ceiling" if above else ""), (pos, value), ha="center",
                va="bottom", fontsize=SMALL_PT, xytext=(0, 2), textcoords="offset points",
                color=ABOVE_COLOR if above else CEILING_COLOR, fontweight="bold" if above else "normal")


def _bar_marks(ax: plt.Axes, cell: pd.DataFrame, pos: float, width: float, value: float,
               err: tuple[str | None, str | None], ceiling: tuple[str | None, str]) -> None:
    """A bar's error bar (from the ``err`` columns) and its own ceiling dash (``ceiling``: column, label)."""
    (err_low, err_high), (ceiling_col, ceiling_label) = err, ceiling
    if err_low and err_high and err_low in cell and err_high in cell:
        low, high = float(cell[err_low].iloc[0]), float(cell[err_high].iloc[0])
        if not (math.isnan(low) or math.isnan(high)):
            ax.errorbar(pos, value, yerr=[[max(value - low, 0)], [max(high - value, 0)]], fmt="none",
                        ecolor="#333333", capsize=3, linewidth=1, zorder=3)
    if ceiling_col and ceiling_col in cell:
        top = float(cell[ceiling_col].iloc[0])
        if not math.isnan(top) and top > 0:
            ax.hlines(top, pos - width * 0.46, pos + width * 0.46, colors=CEILING_COLOR, linestyles="--",
                      linewidth=1.4, label=ceiling_label, zorder=3)


# Over 50 lines only for its keyword options, one a line as ruff formats them; the body is short.
def ratio_heatmap(
    df: pd.DataFrame,
    *,
    index: str | Sequence[str],
    columns: str,
    values: str,
    alt: str,
    label: str,
    caption: str = "",
    col: str | None = "target",
    facets: Sequence[str] | None = None,
    facet_titles: Mapping[str, str] | None = None,
    fmt: str = "{:.2f}",
    center: float = 1.0,
    higher_is_better: bool = True,
) -> Figure:
    """Annotated heatmap of a ratio (e.g. speed-up over ``native``), centred on ``center``, one per target.

    The colour scale is diverging and symmetric in log space around ``center`` (2x and 0.5x get equally
    strong colours), blue meaning better whichever direction is better for this ratio.
    """
    facet_values = _facets(df, col, facets)
    index = [index] if isinstance(index, str) else list(index)
    grids = []
    for facet in facet_values:
        part = df if facet is None else df[df[col].astype(str) == facet]
        grid = part.pivot_table(index=index, columns=columns, values=values, aggfunc="first")
        grid = grid[[c for c in series_order(grid.columns.astype(str)) if c in grid.columns]]
        grids.append(grid)
    finite = np.concatenate([np.log(g.to_numpy(dtype=float)[np.isfinite(g.to_numpy(dtype=float))
                                                               & (g.to_numpy(dtype=float) > 0)]) for g in grids]
                            or [np.array([])])
    span = max(float(np.abs(finite - math.log(center)).max()) if finite.size else 0.0, math.log(1.5))
    norm = TwoSlopeNorm(vcenter=math.log(center), vmin=math.log(center) - span, vmax=math.log(center) + span)
    rows = max((len(g) for g in grids), default=1)
    fig, axes = panels(len(facet_values), height=max(2.2, 0.42 * rows + 1.4), sharey=False)
    cmap = "RdBu" if higher_is_better else "RdBu_r"
    for ax, facet, grid in zip(axes, facet_values, grids, strict=False):
        if grid.empty:
            ax.set_axis_off()
            _facet_title(ax, facet, facet_titles, True)
            continue
        if pd.api.types.is_numeric_dtype(grid.index.dtype):
            grid.index = [format_count(v) for v in grid.index]
        logged = np.log(grid.where(grid > 0))
        annot = grid.map(lambda v: "–" if pd.isna(v) else fmt.format(v))
        sns.heatmap(logged, ax=ax, cmap=cmap, norm=norm, annot=annot, fmt="", cbar=False, linewidths=0.5,
                    linecolor="white", annot_kws={"fontsize": SMALL_PT})
        ax.set_xlabel(columns)
        ax.set_ylabel(" / ".join(index))
        ax.tick_params(axis="x", rotation=30)
        ax.tick_params(axis="y", rotation=0)
        _facet_title(ax, facet, facet_titles, False)
    fig.suptitle(label, fontsize=SMALL_PT + 1, y=1.0)
    fig.tight_layout()
    return embed(fig, alt, caption, df)


# Over 50 lines only for its keyword options, one a line as ruff formats them; the body is short.
def ratio_strip(
    df: pd.DataFrame,
    *,
    ratio: str,
    row: str,
    alt: str,
    xlabel: str,
    hue: str | None = None,
    caption: str = "",
    reference: float = 1.0,
    hue_colors: Mapping[str, str] | None = None,
    data: pd.DataFrame | None = None,
) -> Figure:
    """One dot per cell on a log axis, one line per ``row`` category, with the reference ratio drawn.

    For "how many times faster is target B than A" (reference 1) or a run-to-run change; a diamond marks
    each row's geometric mean.
    """
    plot = df[np.isfinite(pd.to_numeric(df[ratio], errors="coerce")) & (df[ratio] > 0)].copy()
    rows = list(dict.fromkeys(plot[row].astype(str)))
    fig, axes = panels(1, height=max(1.6, 0.42 * len(rows) + 1.1))
    ax = axes[0]
    if plot.empty:
        ax.text(0.5, 0.5, "no cells to compare", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return embed(fig, alt, caption, data if data is not None else df)
    positions = {name: i for i, name in enumerate(rows)}
    rng = np.random.default_rng(0)  # fixed jitter: the same results always draw the same picture
    colors = dict(hue_colors or {})
    if hue and not colors:
        colors = {k: v for k, v in series_colors(plot[hue].astype(str)).items()}
    groups = plot.groupby(plot[hue].astype(str), sort=False) if hue else [(None, plot)]
    for name, group in groups:
        y = group[row].astype(str).map(positions) + rng.uniform(-0.18, 0.18, len(group))
        ax.scatter(group[ratio], y, s=18, alpha=0.75, color=colors.get(name) if name else None,
                   label=name, edgecolors="none", zorder=3)
    for name, i in positions.items():
        values = plot.loc[plot[row].astype(str) == name, ratio]
        mean = float(np.exp(np.log(values).mean()))
        ax.scatter([mean], [i], marker="D", s=46, color="white", edgecolors=CEILING_COLOR, linewidths=1.4,
                   zorder=4, label="geometric mean")
        ax.annotate(f"{mean:.2f}×", (mean, i), xytext=(7, -3), textcoords="offset points", fontsize=SMALL_PT)
    ax.axvline(reference, color=CEILING_COLOR, linestyle="--", linewidth=1.1, zorder=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    low, high = min(float(plot[ratio].min()), reference), max(float(plot[ratio].max()), reference)
    # Room on the right for the geometric-mean labels; never narrower than 0.8x..1.25x around the line.
    left, right = min(low, reference / 1.25) / 1.3, max(high, reference * 1.25) * 2.2
    ax.set_xlim(left, right)
    # Ticks at 1-2-5 steps (0.5×, 1×, 2×, 5×...) rather than matplotlib's 3×10⁻¹ minor labels.
    nice = [m * 10.0**e for e in range(-6, 7) for m in (1, 2, 5) if left <= m * 10.0**e <= right]
    ax.xaxis.set_major_locator(FixedLocator(nice))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}×"))
    shared_legend(fig, [ax], hue)
    return embed(fig, alt, caption, data if data is not None else df)


def value_heatmap(
    df: pd.DataFrame,
    *,
    index: str,
    columns: str,
    values: str,
    alt: str,
    label: str,
    caption: str = "",
    fmt: str = "{:.2f}",
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    column_order: Sequence[str] | None = None,
) -> Figure:
    """Annotated heatmap of one value per (index, column) cell on a sequential colour scale, e.g.
    occupancy by kernel x architecture; empty cells show a dash."""
    grid = df.pivot_table(index=index, columns=columns, values=values, aggfunc="first")
    if column_order is not None:
        grid = grid[[c for c in column_order if c in grid.columns]]
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN * 0.8, max(2.2, 0.4 * len(grid) + 1.3)))
    annot = grid.map(lambda v: "–" if pd.isna(v) else fmt.format(v))
    sns.heatmap(grid.astype(float), ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, annot=annot, fmt="", cbar=True,
                linewidths=0.5, linecolor="white", annot_kws={"fontsize": SMALL_PT}, cbar_kws={"label": label})
    ax.grid(False)  # empty cells stay blank instead of showing the style's grid
    ax.set_xlabel(columns)
    ax.set_ylabel(index)
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(label, loc="left", fontsize=SMALL_PT + 1)
    fig.tight_layout()
    return embed(fig, alt, caption, df)
