"""The compare rule on an A/A pair of two devices of one kind, built from a recorded H100 run.

Two H100s measuring the same build differed by up to +5.4% on latency-bound cases (gelu native at 98,432
elements), beyond each run's own noise, and by less than the 3% minimum effect on bandwidth-bound ones. The second
"device" here is the recorded run with each cell's blocks resampled (its recorded spread) and its times moved by
those device-to-device offsets: it must flag nothing, while a real 10% slowdown of a bandwidth-bound cell is
flagged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpulab.report.compare import AMBIGUOUS, SLOWER, compare_runs, regressions
from gpulab.report.results import ResultsIndex
from gpulab.timing import format_blocks, parse_blocks

H100 = Path(__file__).resolve().parent / "fixtures" / "bench" / "h100"
OPS = ("gelu", "add")
# What the second H100 of the pair did to latency-bound cells (the largest A/A change seen); bandwidth-bound cells
# agreed within their noise.
DEVICE_OFFSET = {"latency": 1.054}


def _second_device(row: pd.Series, rng: np.random.Generator, slower: float = 1.0) -> pd.Series:
    blocks = parse_blocks(row["times_ms"])
    if not blocks:
        return row
    offset = DEVICE_OFFSET.get(row.get("regime"), 1.0) * slower
    drawn = [blocks[i] * offset for i in rng.integers(0, len(blocks), len(blocks))]
    times = np.concatenate(drawn)
    return pd.Series({
        **row.to_dict(), "times_ms": format_blocks(drawn), "median_ms": float(np.median(times)),
        "p10_ms": float(np.percentile(times, 10)), "p90_ms": float(np.percentile(times, 90))})


def _pair(tmp_path: Path, slow: dict[str, object] | None = None) -> tuple[ResultsIndex, ResultsIndex]:
    first, second = tmp_path / "a" / "h100", tmp_path / "b" / "h100"
    for root in (first, second):
        shutil.copytree(H100 / "env", root / "env")
        (root / "bench").mkdir()
        for op in OPS:
            shutil.copy(H100 / "bench" / f"{op}.csv", root / "bench")
    rng = np.random.default_rng(0)
    for op in OPS:
        table = pd.read_csv(first / "bench" / f"{op}.csv")
        rows = []
        for _, row in table.iterrows():
            hit = slow is not None and all(str(row[k]) == str(v) for k, v in slow.items())
            rows.append(_second_device(row, rng, 1.10 if hit else 1.0) if row["status"] == "ok" else row)
        pd.DataFrame(rows).to_csv(second / "bench" / f"{op}.csv", index=False)
    return ResultsIndex(first.parent), ResultsIndex(second.parent)


@pytest.fixture(scope="module")
def a_a(tmp_path_factory) -> pd.DataFrame:
    return compare_runs(*_pair(tmp_path_factory.mktemp("aa")))


def test_an_a_a_pair_of_two_h100s_flags_no_regression(a_a):
    assert len(a_a) == 180 and set(a_a["artifact"]) == {"bench/gelu.csv", "bench/add.csv"}
    assert regressions(a_a).empty, regressions(a_a)[["artifact", "impl", "size", "dtype", "change_pct", "note"]]


def test_the_latency_bound_cells_that_moved_are_ambiguous(a_a):
    cell = a_a[(a_a["artifact"] == "bench/gelu.csv") & (a_a["impl"] == "native") & (a_a["size"] == 98432)
               & (a_a["dtype"] == "fp32")].iloc[0]
    assert cell["verdict"] in (AMBIGUOUS, "no significant change"), cell
    ambiguous = a_a[a_a["verdict"] == AMBIGUOUS]
    assert not ambiguous.empty and ambiguous["note"].str.contains("latency-bound").all()


def test_a_ten_percent_slowdown_of_a_bandwidth_bound_cell_is_flagged(tmp_path):
    slow = {"op": "gelu", "impl": "native", "dtype": "fp32", "size": 268435456}
    deltas = compare_runs(*_pair(tmp_path, slow))
    flagged = regressions(deltas)
    assert len(flagged) == 1, flagged[["artifact", "impl", "size", "dtype", "change_pct"]]
    row = flagged.iloc[0]
    assert row["verdict"] == SLOWER and (row["impl"], int(row["size"]), row["dtype"]) == ("native", 268435456, "fp32")
    assert row["change_pct"] == pytest.approx(10.0, abs=1.5)
