"""One plotting style for every figure, and figures embedded as data URIs (no external files)."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # headless: the report renders on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

PALETTE = "colorblind"


def apply_style() -> None:
    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 110, "axes.titleweight": "bold",
                         "figure.autolayout": False})


def to_data_uri(fig: plt.Figure) -> str:
    """PNG of the figure as a data: URI, then closed so long reports do not accumulate figures."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def draw_ceiling(ax: plt.Axes, value: float, label: str, color: str = "black") -> None:
    """Ceilings are dashed horizontal lines with their value in the label."""
    if value and value == value:  # skip NaN
        ax.axhline(value, linestyle="--", linewidth=1.2, color=color, label=label)
