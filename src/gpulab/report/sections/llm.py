"""LLM inference: the study's Qwen run beside ours, llama-bench-style figures per engine against the
read-only roofline (honest bytes per token), the correctness checks, and which weights every row used."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pandas as pd

from gpulab.llm import study
from gpulab.llm.profile import category_summary
from gpulab.report import findings, plots

ORDER = 60
ID = "llm"
TITLE = "LLM inference"
TEMPLATE = "llm.html.j2"

MODEL_LABEL = "model [weights]"
# The study's Chinese prompt and answer, in English for readers (and for those whose browser lacks a CJK font).
ENGLISH = {
    study.SYSTEM_PROMPT: "You are a gifted poet.",
    study.USER_PROMPT: "Hello, please use this high-performance graphics card to write me a seven-character quatrain "
                       "about AMD graphics cards turning the tables.",
    study.REPORTED["response"]: "Once the graphics emperor N reigned alone; today AMD stirs the winds and clouds. "
                                "Radeon turns the tide, its performance surpassing the old king.",
}
SOURCE_LABELS = {"real": "real weights", "random": "random weights (speed and memory only)",
                 "tiny": "tiny built-in model"}

# The section leads with engine fast's tokens/s over its peers' in the same run, per figure.
LEAD, PEERS = "fast", ("hf_compiled", "hf")
LEAD_FIGURES = {"tg": "decode", "pp": "prefill", "study": "study run"}


def _ok_row(rows: pd.DataFrame, engine: str) -> pd.Series | None:
    hit = rows[(rows["engine"] == engine) & (rows["status"] == "ok")]
    return hit.iloc[0] if not hit.empty else None


def lead_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """fast's tokens/s over each peer's, per target, model and figure (decode, prefill, the study run); empty
    where the peer has no ok row of that figure."""
    kinds = df["test"].astype(str).str.replace(r"\d+$", "", regex=True)
    rows = []
    for (target, model), group in df.assign(kind=kinds).groupby(["target", "model"], sort=False):
        for kind, label in LEAD_FIGURES.items():
            tests = group[group["kind"] == kind]
            fast = _ok_row(tests, LEAD)
            if fast is None:
                continue
            tok_s = _num(fast, "tok_s")
            row = {"target": target, "model": model, "figure": label, "test": fast["test"], f"{LEAD} tok/s": tok_s}
            for peer in PEERS:
                other = _ok_row(tests, peer)
                row[f"× {peer}"] = tok_s / _num(other, "tok_s") if other is not None else math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def lead_sentences(df: pd.DataFrame, ratios: pd.DataFrame) -> list[str]:
    """One sentence per target and model: fast's decode speed as a multiple of each peer's, or why a peer has
    none (its status and reason, or no row in this run)."""
    sentences = []
    for row in ratios.to_dict("records"):
        if row["figure"] != LEAD_FIGURES["tg"]:
            continue
        parts = []
        for peer in PEERS:
            if not math.isnan(row[f"× {peer}"]):
                parts.append(f"{row[f'× {peer}']:,.2f}× {peer}'s")
                continue
            peer_rows = _tests(df[(df["target"] == row["target"]) & (df["model"] == row["model"])
                                  & (df["engine"] == peer)], "tg")
            why = "not measured in this run" if peer_rows.empty else \
                f"{peer_rows.iloc[0]['status']}: {peer_rows.iloc[0]['reason']}"
            parts.append(f"no {peer} figure ({why})")
        sentences.append(f"{LEAD} decodes {row['model']} on {row['target']} at {row[f'{LEAD} tok/s']:,.1f} tok/s "
                         f"({row['test']}): {'; '.join(parts)}.")
    return sentences


def _label(row: pd.Series) -> str:
    return f"{row['model']} [{row['model_source']}]"


def _tests(df: pd.DataFrame, prefix: str) -> pd.DataFrame:
    return df[df["test"].astype(str).str.startswith(prefix)]


def bench_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per target, model and engine: pp and tg tokens/s (mean ± sd), TTFT, memory, roofline."""
    rows = []
    for (target, model, engine), group in df.groupby(["target", "model", "engine"], sort=False):
        def pick(prefix: str, g: pd.DataFrame = group) -> pd.Series | None:
            hit = _tests(g, prefix)
            return hit.iloc[0] if not hit.empty else None

        pp, tg, ttft, run = pick("pp"), pick("tg"), pick("ttft"), pick("study")
        first = group.iloc[0]
        statuses = sorted(set(group["status"].astype(str)))
        rows.append({
            "target": target,
            "model": model,
            "weights": first.get("model_source"),
            "engine": engine,
            "status": "ok" if statuses == ["ok"] else ", ".join(s for s in statuses if s != "ok"),
            "prefill test": _test(pp), "prefill tok/s": _num(pp, "tok_s"), "prefill ± sd": _num(pp, "tok_s_sd"),
            "decode test": _test(tg), "decode tok/s": _num(tg, "tok_s"), "decode ± sd": _num(tg, "tok_s_sd"),
            "prefill tok/J": _num(pp, "tok_per_j"),
            "decode tok/J": _num(tg, "tok_per_j"),
            "TTFT (ms)": _num(ttft, "mean_ms"),
            "study tok/s": _num(run, "tok_s"),
            "decode GB/s": _num(tg, "gbps"),
            "% of ceiling": _num(tg, "pct_of_ceiling"),
            "% of datasheet": _num(tg, "pct_of_datasheet"),
            "roofline tok/s": _num(tg, "roofline_tok_s"),
            "peak alloc (GiB)": pd.to_numeric(group.get("peak_alloc_gib"), errors="coerce").max(),
            "load (s)": _num(first, "load_s"),
        })
    return pd.DataFrame(rows)


# The speed columns of the engines' table; the rest (bandwidth, energy, memory) form a second table, so neither runs
# past the page's width.
SPEED_COLUMNS = ("prefill test", "prefill tok/s", "prefill ± sd", "decode test", "decode tok/s", "decode ± sd",
                 "TTFT (ms)", "study tok/s", "status")


def _split(table: pd.DataFrame) -> list[pd.DataFrame]:
    keys = [c for c in ("target", "model", "weights", "engine") if c in table.columns]
    speed = [c for c in SPEED_COLUMNS if c in table.columns]
    return [table[keys + speed], table[keys + [c for c in table.columns if c not in keys and c not in speed]]]


def _num(row: pd.Series | None, column: str) -> float:
    if row is None or column not in row:
        return math.nan
    value = pd.to_numeric(pd.Series([row[column]]), errors="coerce").iloc[0]
    return float(value)


def _test(row: pd.Series | None) -> str:
    """The llama-bench test a figure is of (``tg128``: 128 tokens generated), its value and spread beside it."""
    return "–" if row is None else str(row["test"])


# The correctness table's columns in words.
CHECK_COLUMNS = {"model_source": "weights", "tokens_match": "tokens match", "first_mismatch": "first mismatch",
                 "logit_rel_err": "logit error (relative)", "worst_position": "at position",
                 "ref_self_err": "transformers against itself"}


def check_words(test: str) -> str:
    """A check's name with what it checks: ``teacher256`` is teacher forcing over 256 positions."""
    if match := re.fullmatch(r"greedy(\d+)", str(test)):
        return f"{test}: the first {match.group(1)} greedy tokens equal generate's"
    if match := re.fullmatch(r"teacher(\d+)", str(test)):
        return f"{test}: logits over {match.group(1)} teacher-forced positions within the bound"
    return str(test)


def unlike_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's study rows that ran another model, other weights or another device than the study did."""
    reported = study.REPORTED
    return [r for r in rows[1:] if r["model"] != reported["model"] or r["weights"] != "real"
            or r["device"] != reported["device"]]


def study_rows(df: pd.DataFrame, responses: dict[tuple[str, str, str], str]) -> list[dict[str, Any]]:
    """The study's reported run first, then every study row measured here, with its response."""
    reported = study.REPORTED
    rows = [{"who": "the study", "target": "–", "device": reported["device"], "model": reported["model"],
             "weights": "real", "engine": reported["engine"], "n_gen": None, "tok_s": reported["tok_s"],
             "peak_alloc_gib": reported["peak_alloc_gib"], "load_s": reported["load_s"], "pct": math.nan,
             "status": "ok", "reason": "", "response": reported["response"]}]
    for row in _tests(df, "study").itertuples():
        rows.append({"who": "this run", "target": row.target, "device": getattr(row, "device", "–"),
                     "model": row.model, "weights": row.model_source, "engine": row.engine,
                     "n_gen": getattr(row, "n_gen", None), "tok_s": getattr(row, "tok_s", math.nan),
                     "peak_alloc_gib": getattr(row, "peak_alloc_gib", math.nan),
                     "load_s": getattr(row, "load_s", math.nan), "pct": getattr(row, "pct_of_ceiling", math.nan),
                     "status": row.status, "reason": row.reason,
                     "response": responses.get((row.target, row.model, row.engine), "")})
    return rows


def _responses(ctx: Any, df: pd.DataFrame) -> tuple[dict[tuple[str, str, str], str], dict[tuple[str, str], Any]]:
    """Study responses and greedy texts from the JSON files beside the CSVs."""
    responses: dict[tuple[str, str, str], str] = {}
    settings: dict[tuple[str, str], Any] = {}
    for row in df.drop_duplicates(["target", "model", "engine"]).itertuples():
        name = getattr(row, "text_file", None)
        if not isinstance(name, str):
            continue
        path = ctx.results.own_file(row.target, name, under="llm", cell=f"{row.target}/{row.source}: text_file")
        text = ctx.results.read_text(path) if path is not None else None
        try:
            document = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            continue
        run = document.get("study") if isinstance(document, dict) else None
        run = run if isinstance(run, dict) else {}
        responses[(row.target, row.model, row.engine)] = run.get("response", "")
        if run:
            settings[(row.target, row.model)] = {"sampling": _sampling_text(run.get("sampling") or {}),
                                                 "n_prompt": run.get("n_prompt"),
                                                 "max_new_tokens": run.get("max_new_tokens")}
    return responses, settings


def _sampling_text(sampling: dict[str, Any]) -> str:
    if not sampling.get("do_sample"):
        return "greedy"
    return (f"sampling at temperature {sampling.get('temperature')}, top-k {sampling.get('top_k') or 'off'}, "
            f"top-p {sampling.get('top_p')}, repetition penalty {sampling.get('repetition_penalty')}")


def _with_spread(df: pd.DataFrame, test: str) -> pd.DataFrame:
    """The rows of one test, with tokens/s at mean - sd and mean + sd for the error bars."""
    rows = _tests(df, test).copy()
    rows["tok_s_low"] = rows["tok_s"] - rows["tok_s_sd"].fillna(0)
    rows["tok_s_high"] = rows["tok_s"] + rows["tok_s_sd"].fillna(0)
    return rows


def _throughput_figures(df: pd.DataFrame, labels: Any) -> list[Any]:
    """Decode tokens/s against each bar's roofline, and prefill tokens/s, when measured."""
    tg, pp = _with_spread(df, "tg"), _with_spread(df, "pp")
    figures = []
    if not tg.empty:
        figures.append(plots.bars_by_target(
            tg, x=MODEL_LABEL, y="tok_s", hue="engine", ylabel="decode tokens/s (tg, mean ± sd)",
            alt="Decode tokens per second per model and engine, each bar against its read-only roofline",
            caption="Generation forced to its length after a one-token prompt. The dash over each bar is the "
                    "roofline: measured read-only bandwidth / bytes a step reads (every weight but the input "
                    "embedding table, plus the KV cache at the test's mean context length).",
            ceiling_col="roofline_tok_s", ceiling_label="read-only roofline", err_low="tok_s_low",
            err_high="tok_s_high", facet_titles=labels, value_format="{:.1f}",
            data_columns=["target", "model", "model_source", "engine", "test", "status", "tok_s", "tok_s_sd",
                          "bytes_per_token", "gbps", "gbps_all_weights", "ceiling_gbps", "ceiling_pattern",
                          "roofline_tok_s", "pct_of_ceiling", "reps", "timer"]))
    if not pp.empty:
        figures.append(plots.bars_by_target(
            pp, x=MODEL_LABEL, y="tok_s", hue="engine", ylabel="prefill tokens/s (pp, mean ± sd)",
            alt="Prompt-processing tokens per second per model and engine", err_low="tok_s_low",
            err_high="tok_s_high", facet_titles=labels, value_format="{:.0f}",
            data_columns=["target", "model", "model_source", "engine", "test", "status", "tok_s", "tok_s_sd",
                          "mean_ms", "reps", "timer"]))
    energy = _energy_figure(df)
    return figures + ([energy] if energy is not None else [])


# One marker per kind of test (its name without the token count); the colour is the engine.
TEST_MARKERS = {"pp": "o", "ttft": "s", "tg": "^", "study": "D"}
# Guides of constant mean power on the energy figure (energy = power x time: diagonals on log axes).
POWER_GUIDES_W = (30, 100, 300, 1000)


def _energy_figure(df: pd.DataFrame) -> Any:
    """Energy of one call against its time: a panel per target and model, a colour per engine, a marker per kind
    of test, and dotted guides of constant mean power. None where no row has a known energy (the rows'
    energy_reason says why)."""
    import seaborn as sns

    if "energy_j" not in df.columns:
        return None
    rows = df[(df["status"] == "ok") & pd.to_numeric(df["energy_j"], errors="coerce").gt(0)].copy()
    if rows.empty:
        return None
    rows["kind"] = rows["test"].astype(str).str.replace(r"\d+$", "", regex=True)
    rows["panel"] = rows["target"].astype(str) + " · " + rows["model"].astype(str)
    keys = sorted(rows["panel"].unique())
    fig, axes = plots.panels(len(keys), sharey=False, per_row=2)
    colors = plots.series_colors(rows["engine"].astype(str).unique())
    markers = {kind: TEST_MARKERS.get(kind, "X") for kind in rows["kind"].unique()}
    for ax, panel in zip(axes, keys, strict=True):
        part = rows[rows["panel"] == panel]
        sns.scatterplot(data=part, x="mean_ms", y="energy_j", hue="engine", style="kind", palette=colors,
                        markers=markers, s=70, ax=ax, zorder=3, legend=False)
        ax.set(xscale="log", yscale="log", xlabel="time per call (ms, mean)", ylabel="device energy per call (J)")
        if len(keys) > 1:
            ax.set_title(panel)
        _power_guides(ax, part)
    _energy_legends(fig, plots.series_order(rows["engine"]), colors, markers)
    return plots.embed(
        fig, alt="Device energy per call against time per call, per engine and test",
        caption="From the device's cumulative energy counter read around each timed block (NVML on NVIDIA, amd-smi "
                "or rocm-smi on AMD), over the calls. A point's mean power is its energy over its time: the dotted "
                "diagonals are constant power. Tokens per joule are in the table below.",
        data=rows[[c for c in ("target", "model", "engine", "test", "mean_ms", "energy_j", "power_w", "tok_per_j",
                               "j_per_token") if c in rows.columns]])


def _energy_legends(fig: Any, engines: list[str], colors: dict[str, Any], markers: dict[str, str]) -> None:
    """Two legends over the panels: the engines' colours and the tests' markers."""
    from matplotlib.lines import Line2D

    def handle(marker: str, color: Any) -> Line2D:
        return Line2D([], [], linestyle="", marker=marker, markersize=8, color=color)

    kinds = [k for k in TEST_MARKERS if k in markers] + sorted(k for k in markers if k not in TEST_MARKERS)
    for title, labels, handles, anchor in (
            ("engine", engines, [handle("o", colors[e]) for e in engines], 0.25),
            ("test", kinds, [handle(markers[k], "0.3") for k in kinds], 0.78)):
        fig.legend(handles, labels, title=title, loc="upper center", bbox_to_anchor=(anchor, 1.0),
                   ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_figheight()))


def _power_guides(ax: Any, part: pd.DataFrame) -> None:
    """Dotted lines of constant mean power across the panel, each labelled where it runs farthest from a point."""
    import numpy as np

    x = np.log10(pd.to_numeric(part["mean_ms"]).to_numpy(float))
    y = np.log10(pd.to_numeric(part["energy_j"]).to_numpy(float))
    lo, hi = (x.min() - 0.3, y.min() - 0.3), (x.max() + 0.3, y.max() + 0.3)
    ax.set(xlim=(10 ** lo[0], 10 ** hi[0]), ylim=(10 ** lo[1], 10 ** hi[1]))
    xs = np.linspace(lo[0], hi[0], 200)
    for watts in POWER_GUIDES_W:
        ys = xs + math.log10(watts / 1e3)  # energy (J) = power (W) x time (ms) / 1000
        inside = np.flatnonzero((ys >= lo[1]) & (ys <= hi[1]))
        if inside.size < 2:
            continue
        ax.plot(10 ** xs, 10 ** ys, linestyle=":", color="0.55", linewidth=1, zorder=1)
        # Not at the segment's ends (the label would leave the panel); away from the points.
        middle = inside[inside.size // 5: inside.size - inside.size // 5]
        gap = np.hypot(xs[middle, None] - x[None, :], ys[middle, None] - y[None, :]).min(axis=1)
        at = middle[int(gap.argmax())]
        ax.annotate(f"{watts} W", (10 ** xs[at], 10 ** ys[at]), ha="center", va="center", color="0.35",
                    fontsize=plots.SMALL_PT, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1}, zorder=2)


TOP_KERNELS = 8


def step_time(ctx: Any) -> dict[str, Any]:
    """Where a prefill's and a decode token's time goes (``llm/kernels/*.csv``): the kernel categories per
    engine and test, in µs per step beside the step's measured time, and each one's largest kernels."""
    rows = ctx.results.tables("llm/kernels/*.csv")
    if rows.empty or "category" not in rows.columns:
        return {}
    keys = ["target", "model", "engine", "test"]
    ok = rows[rows["status"] == "ok"]
    top = (ok.sort_values([*keys, "us_per_step"], ascending=[True] * 4 + [False]).groupby(keys)
           .head(TOP_KERNELS).assign(pct_of_step=lambda f: 100 * f["share_of_step"])
           [[*keys, "kernel", "category", "calls_per_step", "us_per_step", "pct_of_step"]])
    problems = rows[rows["status"] != "ok"][["target", "model", "engine", "test", "status", "reason"]]
    summary = category_summary(rows).round(1).rename(columns={"step": "measured step", "kernels": "all kernels"})
    tokens = ok.loc[ok["test"].astype(str).str.startswith("tg"), "steps"].dropna()
    return {"summary": summary, "top": top, "problems": problems, "tokens": int(tokens.max()) if len(tokens) else None}


def build(ctx: Any) -> dict[str, Any] | None:
    df = ctx.results.tables("llm/*.csv")
    if df.empty or "test" not in df.columns:
        return None
    df = df.copy()
    df[MODEL_LABEL] = df.apply(_label, axis=1)
    responses, settings = _responses(ctx, df)
    figures = _throughput_figures(df, getattr(ctx, "target_labels", None))
    checks = pd.concat([_tests(df, "greedy"), _tests(df, "teacher")])
    check_table = checks[[c for c in ("target", "model", "model_source", "engine", "test", "status", "tokens_match",
                                      "first_mismatch", "logit_rel_err", "worst_position", "ref_self_err", "reason")
                          if c in checks.columns]]
    check_table = check_table.assign(test=check_table["test"].map(check_words)).rename(columns=CHECK_COLUMNS)
    kernels = df.drop_duplicates(["target", "model", "engine"])
    kernel_table = kernels[[c for c in ("target", "model", "engine", "device", "dtype", "attn_impl", "sdpa_kernel",
                                        "graph_mode", "aotriton_experimental", "engine_detail")
                            if c in kernels.columns]]
    sources = sorted(set(df["model_source"].dropna().astype(str)))
    ratios = lead_ratios(df)
    return {
        "lead": {"sentences": lead_sentences(df, ratios), "table": ratios},
        "study": study,
        "study_rows": (rows := study_rows(df, responses)),
        "unlike": unlike_rows(rows),
        "english": ENGLISH,
        "above": findings.above_ceiling_in(ctx.results, "llm/"),
        "settings": [{"target": t, "model": m, **v} for (t, m), v in settings.items()],
        "bench": _split(bench_table(df)),
        "figures": figures,
        "checks": check_table,
        "kernels": kernel_table,
        "step_time": step_time(ctx),
        "sources": [{"name": s, "label": SOURCE_LABELS.get(s, s)} for s in sources],
        "all_rows": df.drop(columns=[MODEL_LABEL, "source"], errors="ignore"),
    }
