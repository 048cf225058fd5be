"""Comparisons: the same cell on two targets (ratios) and on two runs (a statistical verdict per cell).

A cell is one row of an artifact identified by its key columns (op, impl, dtype, size...). Across
targets the question is "how many times faster is this machine". Across runs it is "did this cell's
median time change": decided from the repetition times each row stores (``times_ms``) by a 95%
bootstrap confidence interval of the ratio of medians (new / baseline) that must exclude 1 **and** a
point estimate at least ``min_effect`` (default 3%) away from 1. Fewer than 5 repetitions on either side
gives "no verdict", said so. Rows are paired on the names of their artifact's cells and must agree on its settings
(:data:`gpulab.core.tables.CELLS`: an MLP variant's dim, layers, batch) and on the device (:func:`device_fingerprint`):
a pair that differs in one does other work and is "not comparable", never faster or slower.

The bootstrap resamples whole blocks of repetitions (a cluster bootstrap), not single repetitions.
Repetitions of one block share their conditions (the memory layout, what else the machine was doing),
so they are not independent: on a busy 2-core machine consecutive repetitions agree to 1% while two runs
of the same build differ by 5-35%. ``gpulab.core.timing.measure`` re-draws those conditions before each of its
blocks, so the spread between blocks is a sample of the spread between runs, and resampling blocks
carries it into the interval. Rows recorded before blocks existed are cut into consecutive chunks of
their timed sequence (a block bootstrap of a time series), which carries at least the drift within them.

A state of a shared machine can outlast a whole cell. Where both runs timed the pattern's reference
method beside each case (bench rows' ``reference_times_ms``, a block of it after each of the case's), a
change is flagged only where the times relative to the reference changed the same way too: each block of
the case divided by the median of its reference block, judged by the same rule. A change of the machine
moves the case and the reference alike, an edit of the kernel only the case; a reference of a few
microseconds is itself noisy, which the time alone is not. Requiring both keeps the false-flag rate at most
that of either (an intersection-union test); ``change_pct`` stays the change of the time, beside
``relative_change_pct`` and ``reference_change_pct``.

Two devices of one kind (other host CPUs, clocks, drivers) differ on short calls beyond any run's own noise,
which the confidence interval cannot see, so each case has its own minimum effect; a significant change below it
is "ambiguous", never a regression (docs/decisions.md, "A compare rule an A/A pair never fails"):
:data:`FLOOR_SHARE` of the launch floor (the shortest call of either run's ceilings table) over the case's
median, and for a latency-bound case (``regime``: its ceiling at that size is below half the plateau, so a launch,
not bandwidth, sets its time; the ceilings table's rows get theirs from the table) at least
:data:`LATENCY_MIN_EFFECT` and half the interdecile range of its repetitions (either run).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpulab.core.ceilings import CEILINGS, with_regimes
from gpulab.core.history import runs
from gpulab.core.tables import cell_key
from gpulab.core.timing import parse_blocks
from gpulab.report.results import key_columns, number

# Throughput columns, best first: where an artifact has one, targets are compared on it (higher is
# better) so cells at different problem sizes (sizes scale with each device) still compare.
THROUGHPUT_COLUMNS = ("tok_s", "gbps", "tflops", "gflops")
SIZE_COLUMN = "size"
# Numeric magnitude of a size, when "size" itself is a shape string.
SIZE_ORDER_COLUMNS = ("numel", "tensor_bytes", "bytes_moved")

FASTER = "faster"
SLOWER = "slower"
WITHIN = "no significant change"
NO_VERDICT = "no verdict"
AMBIGUOUS = "ambiguous"
STATUS_CHANGED = "status changed"
NOT_COMPARABLE = "not comparable"
ONLY_A = "only in baseline"
ONLY_B = "only in this run"
VERDICTS = (SLOWER, STATUS_CHANGED, FASTER, NOT_COMPARABLE, AMBIGUOUS, WITHIN, NO_VERDICT, ONLY_A, ONLY_B)
FLAGGED = (SLOWER, STATUS_CHANGED, FASTER)
# Cells no gate can read: a run that judged none of its cells neither passes nor fails.
UNJUDGED = (NOT_COMPARABLE, NO_VERDICT, ONLY_A, ONLY_B)
# The setting compare adds to every row: the device it ran on, from the target's env.json.
DEVICE_SETTING = "device"
MIN_EFFECT = 0.03  # smallest change of the median worth flagging (fraction)
MIN_REPS = 5  # fewer repetitions on either side: no verdict
# Smallest change of a latency-bound case's median that is flagged: two H100s measuring one build differed by up to
# 13% on such cases (docs/decisions.md); half as much again is where a change is the kernel's, not the device's.
LATENCY_MIN_EFFECT = 0.20
# Share of the device's launch floor (its shortest timed call) a case's change must exceed: two H100s measuring one
# build differed by 0.5-0.8 µs a call on short bandwidth-bound cases, up to 18% of their 4.3 µs floor.
FLOOR_SHARE = 0.25
LATENCY = "latency"
CEILINGS_TABLE = CEILINGS.path
BOOTSTRAP_RESAMPLES = 2000
# Chunks a row recorded as one block is cut into (its repetitions are in timed order).
LEGACY_CHUNKS = 8
CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioTable:
    """Values of one metric per target, side by side, with each target's ratio to the baseline target."""

    frame: pd.DataFrame
    baseline: str
    targets: list[str]
    value: str
    higher_is_better: bool
    matched_on: str  # "same cell" | "largest size each target ran"
    ratio_columns: list[str]


def with_throughput(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The frame with one throughput per row, and its name.

    Most artifacts have one throughput column (``gbps``); some measure different things per row
    (ceilings: copy rows in GB/s, matmul rows in TFLOP/s): those are combined into ``throughput``,
    each row taking the first of its columns that has a value.
    """
    present = [c for c in THROUGHPUT_COLUMNS if c in df.columns and pd.to_numeric(df[c], errors="coerce").notna().any()]
    if not present:
        return df, None
    first = pd.to_numeric(df[present[0]], errors="coerce")
    combined = first.copy()
    used = [present[0]]
    for column in present[1:]:
        values = pd.to_numeric(df[column], errors="coerce")
        fills = combined.isna() & values.notna()
        if fills.any():
            combined = combined.where(~fills, values)
            used.append(column)
    if len(used) == 1:
        return df, present[0]
    name = "throughput (" + " | ".join(used) + ")"
    return df.assign(**{name: combined}), name


def ratio_label(target: str, baseline: str) -> str:
    return f"{target} vs {baseline} (×)"


def cross_target_ratios(
    df: pd.DataFrame,
    *,
    value: str,
    keys: Sequence[str] | None = None,
    baseline: str | None = None,
    higher_is_better: bool = True,
    size: str = SIZE_COLUMN,
) -> RatioTable | None:
    """Per cell, the metric on each target and each target's ratio to ``baseline`` (above 1: better).

    Only ``ok`` rows count. When the targets ran no common sizes (``auto`` sizes scale with each
    device) and ``value`` is a throughput, each target's largest size is compared instead, and the
    sizes are shown. Returns None when fewer than two targets have rows.
    """
    if df.empty or "target" not in df.columns or value not in df.columns:
        return None
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    ok = ok[ok[value].notna()]
    targets = sorted(ok["target"].astype(str).unique())
    if len(targets) < 2:
        return None
    baseline = baseline if baseline in targets else targets[0]
    keys = [k for k in (keys if keys is not None else key_columns(ok)) if k != "target" and k in ok.columns]
    if not keys:
        return None
    ok = ok.drop_duplicates(subset=[*keys, "target"])
    wide = ok.pivot_table(index=keys, columns="target", values=value, aggfunc="first")
    matched_on = "same cell"
    if wide.dropna().empty and size in keys and higher_is_better:
        by_largest = _largest_sizes(ok, keys, value, size)
        if by_largest is not None:
            wide, matched_on = by_largest, "largest size each target ran"
    ratio_columns = []
    for t in targets:
        if t == baseline or t not in wide.columns or baseline not in wide.columns:
            continue
        name = ratio_label(t, baseline)
        wide[name] = wide[t] / wide[baseline] if higher_is_better else wide[baseline] / wide[t]
        ratio_columns.append(name)
    frame = wide.reset_index()
    frame.columns.name = None
    return RatioTable(frame, baseline, targets, value, higher_is_better, matched_on, ratio_columns)


def _largest_sizes(ok: pd.DataFrame, keys: Sequence[str], value: str, size: str) -> pd.DataFrame | None:
    """``value`` per cell at each target's largest size (sizes shown beside), for targets with no size in
    common; None when the rows cannot be ordered by size."""
    rest = [k for k in keys if k not in (size, *SIZE_ORDER_COLUMNS)]
    # "size" may be a shape string (softmax "4096x1024"): order by element count when rows carry it.
    order = next((c for c in SIZE_ORDER_COLUMNS if c in ok.columns), size)
    magnitude = pd.to_numeric(ok[order], errors="coerce")
    if not rest or not magnitude.notna().all():
        return None
    largest = ok.loc[magnitude.groupby([ok[k] for k in [*rest, "target"]]).idxmax()]
    wide = largest.pivot_table(index=rest, columns="target", values=value, aggfunc="first")
    sizes = largest.pivot(index=rest, columns="target", values=size)
    for t in sizes.columns:
        wide[f"{size} ({t})"] = sizes[t]
    return wide


def geometric_mean(values: pd.Series) -> float:
    clean = values[np.isfinite(values) & (values > 0)]
    return float(np.exp(np.log(clean).mean())) if not clean.empty else math.nan


# ---------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Verdict:
    verdict: str
    ratio: float  # median new / median baseline (time: above 1 is slower)
    ci_low: float
    ci_high: float
    note: str = ""
    relative: float = math.nan  # the same ratio of the times relative to the reference beside them, where paired
    reference: float = math.nan  # the reference's own ratio of medians


def _resampled_medians(blocks: Sequence[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Median of all repetitions of ``len(blocks)`` blocks drawn with replacement, ``resamples`` times."""
    values = np.concatenate(blocks)
    owner = np.repeat(np.arange(len(blocks)), [b.size for b in blocks])
    order = np.argsort(values, kind="stable")
    values, owner = values[order], owner[order]
    draws = rng.integers(0, len(blocks), size=(resamples, len(blocks)))
    counts = np.stack([np.bincount(d, minlength=len(blocks)) for d in draws])  # times each block was drawn
    weights = np.cumsum(counts[:, owner], axis=1)  # sorted repetitions, each weighted by its block's count
    middle = np.argmax(weights >= weights[:, -1:] / 2, axis=1)
    return values[middle]


def as_blocks(times: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """Blocks of repetitions: as measured, or (one block, recorded before blocks) consecutive chunks."""
    if isinstance(times, np.ndarray):
        times = [times]
    blocks = [np.asarray(b, dtype=np.float64) for b in times if len(b)]
    if len(blocks) == 1 and blocks[0].size >= 2 * LEGACY_CHUNKS:
        return [c for c in np.array_split(blocks[0], LEGACY_CHUNKS)]
    return blocks


def bootstrap_ratio_ci(a: np.ndarray | Sequence[np.ndarray], b: np.ndarray | Sequence[np.ndarray],
                       resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(b) / median(a), resampling each run's blocks (see the module doc)."""
    rng = np.random.default_rng(seed)
    ratios = _resampled_medians(as_blocks(b), rng, resamples) / _resampled_medians(as_blocks(a), rng, resamples)
    tail = 100 * (1 - confidence) / 2
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def times_verdict(a_blocks: np.ndarray | Sequence[np.ndarray], b_blocks: np.ndarray | Sequence[np.ndarray],
                  min_effect: float = MIN_EFFECT) -> Verdict:
    """Faster/slower only when the CI of the ratio of medians excludes 1 and the ratio is at least
    ``min_effect`` away from 1; fewer than MIN_REPS repetitions on either side: no verdict. Each side is
    its repetition times, as one array or as the blocks they were timed in."""
    a, b = _flat(a_blocks), _flat(b_blocks)
    if min(a.size, b.size) < MIN_REPS:
        return Verdict(NO_VERDICT, _ratio(a, b), math.nan, math.nan,
                       f"fewer than {MIN_REPS} repetitions ({a.size} vs {b.size}): no verdict")
    ratio = _ratio(a, b)
    low, high = bootstrap_ratio_ci(as_blocks(a_blocks), as_blocks(b_blocks))
    if low > 1 and ratio >= 1 + min_effect:
        return Verdict(SLOWER, ratio, low, high)
    if high < 1 and ratio <= 1 - min_effect:
        return Verdict(FASTER, ratio, low, high)
    return Verdict(WITHIN, ratio, low, high)


def _flat(times: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    blocks = as_blocks(times)
    return np.concatenate(blocks) if blocks else np.array([], dtype=np.float64)


def _ratio(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.median(b) / np.median(a)) if a.size and b.size and np.median(a) > 0 else math.nan


RUN_COLUMNS = ("status", "median_ms", "p10_ms", "p90_ms", "cv", "reps", "stable")
# What the verdict reads but the table does not show.
PAIRING_COLUMNS = ("times_ms", "reference_times_ms", "reference_method", "regime")
# Where a cell was paired with a reference: the change of its time relative to it, and the reference's own change.
PAIRED_CHANGES = {"relative_change_pct": "relative", "reference_change_pct": "reference"}


def _cell_times(row: Mapping[str, Any]) -> list[np.ndarray]:
    """A row's repetition times (ms) by block; a throughput-only row (tok/s) gives its per-token time once."""
    blocks = parse_blocks(row.get("times_ms"))
    if blocks:
        return blocks
    median = number(row.get("median_ms"))
    if math.isnan(median) and number(row.get("tok_s")) > 0:
        median = 1e3 / number(row.get("tok_s"))
    return [np.array([median])] if not math.isnan(median) else []


def _relative_blocks(row: Mapping[str, Any]) -> list[np.ndarray] | None:
    """Each block of the row's times over the median of the reference block timed beside it; None where the
    row has no reference paired block by block."""
    blocks, references = parse_blocks(row.get("times_ms")), parse_blocks(row.get("reference_times_ms"))
    if not blocks or len(references) != len(blocks):
        return None
    return [block / np.median(reference) for block, reference in zip(blocks, references, strict=True)]


def _paired_verdict(a: Mapping[str, Any], b: Mapping[str, Any], min_effect: float) -> Verdict:
    """The verdict on the times; where both runs timed a reference beside the case, a change stands only if the
    times relative to it changed the same way (see the module doc), and the verdict carries the relative change
    and the reference's own."""
    times = times_verdict(_cell_times(a), _cell_times(b), min_effect)
    relative_a, relative_b = _relative_blocks(a), _relative_blocks(b)
    if relative_a is None or relative_b is None or times.verdict == NO_VERDICT:
        return times
    relative = times_verdict(relative_a, relative_b, min_effect)
    reference = _ratio(_flat(parse_blocks(a["reference_times_ms"])), _flat(parse_blocks(b["reference_times_ms"])))
    method = b.get("reference_method") or "the reference"
    verdict = times.verdict if times.verdict in (SLOWER, FASTER) and relative.verdict == times.verdict else WITHIN
    return Verdict(verdict, times.ratio, times.ci_low, times.ci_high, f"relative to {method}: {relative.verdict}",
                   relative.ratio, reference)


def case_min_effect(a: Mapping[str, Any], b: Mapping[str, Any], min_effect: float,
                    floor_ms: float = math.nan) -> tuple[float, str]:
    """A case's own minimum effect and why it is above ``min_effect`` ('' where it is not): a latency-bound case's
    (either run says so), and for every case :data:`FLOOR_SHARE` of the launch floor over its median (module doc)."""
    found = [(min_effect, "")]
    if LATENCY in (a.get("regime"), b.get("regime")):
        spreads = [(number(r.get("p90_ms")) - number(r.get("p10_ms"))) / (2 * number(r.get("median_ms")))
                   for r in (a, b)]
        found += [(x, "latency-bound") for x in (LATENCY_MIN_EFFECT, *spreads) if x == x and x > 0]
    medians = [m for m in (number(a.get("median_ms")), number(b.get("median_ms"))) if m == m and m > 0]
    if floor_ms == floor_ms and medians:
        found.append((FLOOR_SHARE * floor_ms / min(medians),
                      f"{1e3 * min(medians):.1f} µs a call, near the device's launch floor ({1e3 * floor_ms:.1f} µs)"))
    return max(found, key=lambda item: item[0])


def _own_verdict(a: Mapping[str, Any], b: Mapping[str, Any], min_effect: float, floor_ms: float) -> Verdict:
    """The verdict, with a significant change below the case's own minimum effect ambiguous."""
    verdict = _paired_verdict(a, b, min_effect)
    own, why = case_min_effect(a, b, min_effect, floor_ms)
    if not why or verdict.verdict not in (SLOWER, FASTER) or abs(verdict.ratio - 1) >= own:
        return verdict
    note = (f"{why}: {100 * (verdict.ratio - 1):+.1f}% is significant but below this case's minimum effect "
            f"({100 * own:.0f}%), within what two devices of one kind differ by")
    return Verdict(AMBIGUOUS, verdict.ratio, verdict.ci_low, verdict.ci_high,
                   "; ".join(n for n in (verdict.note, note) if n), verdict.relative, verdict.reference)


def _same(a: Any, b: Any) -> bool:
    """Two cells of a setting column agree: both empty, equal numbers (256 and 256.0), or equal text."""
    x, y = number(a), number(b)
    if not (math.isnan(x) and math.isnan(y)):
        return x == y
    return pd.isna(a) == pd.isna(b) and (pd.isna(a) or str(a) == str(b))


def shown(value: Any) -> str:
    """A cell as a reader writes it: 256 for 256.0, – for an empty one."""
    x = number(value)
    return "–" if pd.isna(value) else f"{x:.0f}" if math.isfinite(x) and x == int(x) else str(value)


def setting_changes(row: Mapping[str, Any], settings: Sequence[str]) -> str:
    """The settings a matched pair differs in, ``dim: 256 → 512``; '' where it agrees on all."""
    return "; ".join(f"{s}: {shown(row[f'{s}_a'])} → {shown(row[f'{s}_b'])}" for s in settings
                     if not _same(row[f"{s}_a"], row[f"{s}_b"]))


def _judge(row: Mapping[str, Any], min_effect: float, floor_ms: float, settings: Sequence[str]) -> Verdict:
    if row["_merge"] == "left_only":
        return Verdict(ONLY_A, math.nan, math.nan, math.nan)
    if row["_merge"] == "right_only":
        return Verdict(ONLY_B, math.nan, math.nan, math.nan)
    changed = setting_changes(row, settings)
    if changed:
        return Verdict(NOT_COMPARABLE, math.nan, math.nan, math.nan, changed)
    status_a, status_b = row.get("status_a"), row.get("status_b")
    if status_a != status_b:
        return Verdict(STATUS_CHANGED, math.nan, math.nan, math.nan, f"{status_a} → {status_b}")
    if status_a is not None and status_a != "ok":
        return Verdict(WITHIN, math.nan, math.nan, math.nan, f"{status_a} in both runs")
    return _own_verdict({k[:-2]: v for k, v in row.items() if k.endswith("_a")},
                        {k[:-2]: v for k, v in row.items() if k.endswith("_b")}, min_effect, floor_ms)


def run_deltas(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str] | None = None,
               min_effect: float = MIN_EFFECT, floor_ms: float = math.nan,
               settings: Sequence[str] = ()) -> pd.DataFrame:
    """Match the cells of one artifact in a baseline run (``a``) and a new run (``b``) on ``keys`` and judge each;
    a pair that differs in one of ``settings`` is not comparable, the note says how.

    Columns: the keys, ``verdict``, ``change_pct`` of the median time (positive: slower; per-token time
    for rows that only have tok/s), where some cell was timed beside a reference in both runs
    ``relative_change_pct`` (of the time relative to it) and ``reference_change_pct`` (of the reference itself),
    the 95% CI of the time ratio, a note, and each run's
    ``status``/``median_ms``/``p10_ms``/``p90_ms``/``cv``/``reps``/``stable`` (suffixes ``_a``, ``_b``).
    """
    if keys is None:
        # Keys of each run on its own: the two runs together repeat every cell by design.
        keys = list(dict.fromkeys([*key_columns(a), *key_columns(b)]))
    keys = [k for k in keys if k in a.columns and k in b.columns]
    if not keys:
        raise ValueError("cannot match rows of two runs without key columns")
    settings = [s for s in settings if s in a.columns and s in b.columns and s not in keys]
    keep = [c for c in (*RUN_COLUMNS, *PAIRING_COLUMNS, "tok_s", *settings) if c in a.columns or c in b.columns]
    left = a.drop_duplicates(subset=keys)[[*keys, *[c for c in keep if c in a.columns]]]
    right = b.drop_duplicates(subset=keys)[[*keys, *[c for c in keep if c in b.columns]]]
    left = left.rename(columns={c: f"{c}_a" for c in keep if c in left.columns})
    right = right.rename(columns={c: f"{c}_b" for c in keep if c in right.columns})
    merged = left.merge(right, on=keys, how="outer", indicator=True)
    judged = [_judge(row, min_effect, floor_ms, settings) for row in merged.to_dict("records")]
    merged = merged.drop(columns="_merge")
    merged["verdict"] = [v.verdict for v in judged]
    merged["change_pct"] = [100.0 * (v.ratio - 1.0) for v in judged]
    merged["ratio 95% CI"] = [f"{v.ci_low:.4f}–{v.ci_high:.4f}" if v.ci_low == v.ci_low else "" for v in judged]
    merged["note"] = [v.note for v in judged]
    paired = [c for c in PAIRED_CHANGES if any(not math.isnan(getattr(v, PAIRED_CHANGES[c])) for v in judged)]
    for column in paired:
        merged[column] = [100.0 * (getattr(v, PAIRED_CHANGES[column]) - 1.0) for v in judged]
    # What a reader looks for first (the verdict and the change) before the evidence, a run beside the other.
    shown = [c for c in keep if c not in (*PAIRING_COLUMNS, *settings)]
    evidence = [f"{c}_{side}" for c in shown for side in ("a", "b") if f"{c}_{side}" in merged.columns]
    merged = merged[[*keys, "verdict", "change_pct", *paired, "ratio 95% CI", "note", *evidence]]
    order = {v: i for i, v in enumerate(VERDICTS)}
    return merged.sort_values(by=["verdict", *keys], key=lambda s: s.map(order) if s.name == "verdict" else s,
                              ignore_index=True)


def regressions(deltas: pd.DataFrame) -> pd.DataFrame:
    """Cells that got significantly slower, or that were ok and are not any more."""
    lost = (deltas["verdict"] == STATUS_CHANGED) & (deltas.get("status_a") == "ok")
    return deltas[(deltas["verdict"] == SLOWER) | lost]


def launch_floor_ms(tables: Mapping[str, pd.DataFrame]) -> float:
    """A run's launch floor: the shortest median of its ceilings table (a copy or add of a few hundred KiB, a launch
    and little else); NaN without one."""
    table = tables.get(CEILINGS_TABLE)
    if table is None or not {"status", "median_ms"} <= set(table.columns):
        return math.nan
    times = pd.to_numeric(table.loc[table["status"] == "ok", "median_ms"], errors="coerce")
    return float(times.min()) if times.notna().any() else math.nan


def cell_columns(name: str, a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[str] | None, list[str]]:
    """The columns two runs' rows of an artifact are paired on and must agree on (:data:`gpulab.core.tables.CELLS`);
    an artifact not declared is paired on :func:`key_columns` (None). Where the names do not make rows unique,
    the settings join them."""
    cell = cell_key(name)
    names = [c for c in cell.names if c in a.columns and c in b.columns] if cell is not None else []
    if cell is None or not names:
        return None, []
    if any(frame.duplicated(subset=names).any() for frame in (a, b)):
        return [*names, *(c for c in cell.settings if c in a.columns and c in b.columns)], []
    return names, list(cell.settings)


def artifact_deltas(name: str, old: Mapping[str, pd.DataFrame], new: Mapping[str, pd.DataFrame],
                    min_effect: float = MIN_EFFECT, devices: tuple[str, str] | None = None) -> pd.DataFrame:
    """One artifact of a target judged in two runs (``old``, ``new``: each run's tables of the target by name), each
    case against the larger of the two runs' launch floors. ``devices`` (each run's :func:`device_fingerprint`):
    where they differ every pair is not comparable; None judges across devices."""
    floors = [f for f in (launch_floor_ms(old), launch_floor_ms(new)) if f == f]
    a, b = _with_regime(name, old[name]), _with_regime(name, new[name])
    keys, settings = cell_columns(name, a, b)
    if devices is not None:
        a, b = a.assign(**{DEVICE_SETTING: devices[0]}), b.assign(**{DEVICE_SETTING: devices[1]})
        settings = [*settings, DEVICE_SETTING]
    return run_deltas(a, b, keys, min_effect=min_effect, floor_ms=max(floors, default=math.nan), settings=settings)


def _with_regime(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """The ceilings table records no regime: its rows get the one of their pattern, dtype and size, so its
    latency-bound sizes are judged as the benchmark cells' are."""
    return with_regimes(table) if name == CEILINGS_TABLE else table


def compare_runs(baseline: Any, new: Any, min_effect: float = MIN_EFFECT, across_devices: bool = False) -> pd.DataFrame:
    """Every measured artifact of every target both runs have (two ``ResultsIndex``), judged cell by cell; cells of
    a target whose device differs are not comparable unless ``across_devices``."""
    from gpulab.report.results import is_measured

    frames = []
    for target in sorted(set(baseline.targets) & set(new.targets)):
        old, now = dict(baseline.artifacts(target)), dict(new.artifacts(target))
        devices = None if across_devices else (device_fingerprint(baseline.env(target)),
                                                device_fingerprint(new.env(target)))
        for name in sorted(set(old) & set(now)):
            if name.startswith("env/") or not (is_measured(old[name]) and is_measured(now[name])):
                continue
            deltas = artifact_deltas(name, old, now, min_effect, devices)
            frames.append(deltas.assign(artifact=name, target=target))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["target", "artifact", "verdict"])


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict to dotted keys (``device.name``), for listing what differs between two captures."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


# Parts of env.json that describe the capture rather than the software/hardware.
ENV_NOISE = ("captured_at", "tools.", "python.executable", "smi.")


def env_differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> pd.DataFrame:
    """Keys of two environment captures whose values differ (what changed between two runs)."""
    flat_a, flat_b = flatten(a or {}), flatten(b or {})
    rows = []
    for key in sorted(set(flat_a) | set(flat_b)):
        if key.startswith(ENV_NOISE):
            continue
        va, vb = flat_a.get(key), flat_b.get(key)
        if va != vb:
            rows.append({"key": key, "baseline": "–" if va is None else str(va),
                         "this run": "–" if vb is None else str(vb)})
    return pd.DataFrame(rows, columns=["key", "baseline", "this run"])



# ---------------------------------------------------------------------------------------------- what ran


def device_fingerprint(env: Mapping[str, Any] | None) -> str:
    """The device a target's rows ran on, as its env.json names it: kind, backend and architecture (a CPU: its
    cores). Two devices of one kind share it; a run without a capture is "unknown"."""
    device = (env or {}).get("device") or {}
    if not device.get("name"):
        return "unknown"
    cores = f"{device['cpu_count']} cores" if device.get("backend") == "cpu" and device.get("cpu_count") else None
    details = [str(d) for d in (device.get("backend"), device.get("arch"), cores) if d]
    return f"{device['name']} ({', '.join(details)})" if details else str(device["name"])


@dataclass(frozen=True)
class RunSummary:
    """One side of a comparison, for one target: what ran where, and with which configuration."""

    target: str
    device: str
    commit: str
    digest: str  # of the effective configuration (gpulab.core.schema.config_hash), as the run's name records it
    params: dict[str, str]  # every step's configuration as it ran (benchmark records), by dotted key


def run_summary(index: Any, target: str, run: str | None = None) -> RunSummary:
    """A target of a ``ResultsIndex``: the kept run ``run`` names (``<time>__<commit>__<digest>``), else the latest
    run kept under the target, else its env.json's commit and no digest."""
    env = index.env(target) or {}
    if run is None:
        kept = runs(index.root / target)
        run = kept[-1].id if kept else None
    parts = (run or "").split("__")
    git = env.get("git") or {}
    commit = parts[1] if len(parts) == 3 else (str(git.get("commit") or "–")[:7] + ("+dirty" if git.get("dirty")
                                                                                   else ""))
    params: dict[str, set[str]] = {}
    for record in index.benchmarks(target):
        for key, value in flatten(record.get("params") or {}).items():
            params.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    return RunSummary(target, device_fingerprint(env), commit, parts[2] if len(parts) == 3 else "–",
                      {k: " | ".join(sorted(v)) for k, v in params.items()})


def config_differences(a: RunSummary, b: RunSummary) -> pd.DataFrame:
    """The configuration keys the two runs' steps ran with different values (``mlp.dim``: ``"auto"`` → ``512``)."""
    rows = [{"key": key, "baseline": a.params.get(key, "–"), "this run": b.params.get(key, "–")}
            for key in sorted(set(a.params) | set(b.params)) if a.params.get(key) != b.params.get(key)]
    return pd.DataFrame(rows, columns=["key", "baseline", "this run"])


def gate_refusal(deltas: pd.DataFrame, devices: Mapping[str, tuple[str, str]], across_devices: bool,
                 targets: tuple[Sequence[str], Sequence[str]]) -> str | None:
    """Why a regression gate cannot read this comparison (one line), or None: the devices of a target differ (and
    the user did not ask to compare across devices), no target is in both runs, or no cell was judged."""
    moved = {t: pair for t, pair in devices.items() if pair[0] != pair[1]}
    if moved and not across_devices:
        which = "; ".join(f"{t}: {a} → {b}" for t, (a, b) in moved.items())
        return f"the devices differ ({which}), so no cell is comparable; give --across-devices to judge them anyway"
    if not set(targets[0]) & set(targets[1]):
        return (f"no target in both runs (baseline: {', '.join(targets[0]) or 'none'}; "
                f"this run: {', '.join(targets[1]) or 'none'})")
    counts = deltas["verdict"].value_counts() if not deltas.empty else pd.Series(dtype=int)
    if counts.drop(list(UNJUDGED), errors="ignore").sum() == 0:
        found = ", ".join(f"{counts[v]} {v}" for v in UNJUDGED if v in counts) or "no measured cell in common"
        return f"no cell was judged in both runs ({found})"
    return None
