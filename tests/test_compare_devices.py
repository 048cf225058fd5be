"""The compare rule on a recorded A/A pair: two H100s measuring one build (tests/fixtures/compare/h100_pair).

The pair differed beyond each run's own noise on short calls: by 0.5-0.8 µs a call on bandwidth-bound cases of
8-32 MiB (up to +6.4%) and by up to 13% on latency-bound ones. At the defaults it must flag nothing either way,
while a real 10% slowdown of a bandwidth-bound cell is flagged.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpulab.core.timing import format_blocks, parse_blocks
from gpulab.report.compare import AMBIGUOUS, FASTER, SLOWER, compare_runs, launch_floor_ms, regressions
from gpulab.report.results import ResultsIndex

# Four compares of about 800 cells each, with 2000 bootstrap resamples a cell: a minute and a half.
pytestmark = pytest.mark.slow

PAIR = Path(__file__).resolve().parent / "fixtures" / "compare" / "h100_pair"
TABLES = ("bench/gelu.csv", "bench/softmax.csv", "bench/add.csv", "bench/ceilings.csv")
SLOW_CELL = {"op": "gelu", "impl": "native", "dtype": "fp32", "size": "268435456"}


def _unpack(side: str, root: Path) -> Path:
    """One side of the pair as a results tree (``root/h100/...``)."""
    target = root / "h100"
    (target / "bench").mkdir(parents=True)
    shutil.copytree(PAIR / side / "h100" / "env", target / "env")
    for name in TABLES:
        with gzip.open(PAIR / side / "h100" / f"{name}.gz", "rb") as packed:
            (target / name).write_bytes(packed.read())
    return root


def _slow_down(root: Path, cell: dict[str, str], factor: float) -> None:
    """Every repetition of one cell of ``root``'s GeLU table ``factor`` times longer (an edited kernel)."""
    path = root / "h100" / "bench" / "gelu.csv"
    table = pd.read_csv(path, dtype={"size": str})
    hit = np.logical_and.reduce([table[k].astype(str) == v for k, v in cell.items()])
    assert hit.sum() == 1
    i = table.index[hit][0]
    blocks = [block * factor for block in parse_blocks(table.at[i, "times_ms"])]
    times = np.concatenate(blocks)
    table.at[i, "times_ms"] = format_blocks(blocks)
    for column, value in (("median_ms", np.median(times)), ("p10_ms", np.percentile(times, 10)),
                          ("p90_ms", np.percentile(times, 90))):
        table.at[i, column] = float(value)
    table.to_csv(path, index=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("pair")
    return _unpack("a", base / "a"), _unpack("b", base / "b")


@pytest.fixture(scope="module")
def judged(pair) -> dict[str, pd.DataFrame]:
    """The pair compared both ways: ``a-b`` (a the baseline) and ``b-a``."""
    a, b = (ResultsIndex(side) for side in pair)
    return {"a-b": compare_runs(a, b), "b-a": compare_runs(b, a)}


@pytest.mark.parametrize("order", ["a-b", "b-a"])
def test_the_h100_pair_flags_no_regression_either_way(judged, order):
    deltas = judged[order]
    assert set(deltas["artifact"]) == set(TABLES)
    assert len(deltas) > 700
    assert regressions(deltas).empty, regressions(deltas)[["artifact", "size", "dtype", "change_pct", "note"]]
    assert not deltas["verdict"].isin([FASTER, SLOWER]).any()


def test_what_moved_between_the_two_devices_is_ambiguous_and_says_why(judged):
    deltas = judged["b-a"]
    ambiguous = deltas[deltas["verdict"] == AMBIGUOUS]
    assert len(ambiguous) > 50
    assert ambiguous["note"].str.contains("latency-bound|near the device's launch floor").all()
    # The bandwidth-bound GeLU cell the runs disagree on by 3.6% (0.77 µs of a 22 µs call).
    cell = deltas[(deltas["artifact"] == "bench/gelu.csv") & (deltas["impl"] == "triton")
                  & (deltas["size"].astype(str) == "16777216") & (deltas["dtype"] == "bf16")].iloc[0]
    assert cell["verdict"] == AMBIGUOUS and cell["change_pct"] == pytest.approx(3.6, abs=0.3)
    assert "launch floor" in cell["note"]


def test_the_launch_floor_is_the_shortest_ceiling_call(pair):
    tables = dict(ResultsIndex(pair[0]).artifacts("h100"))
    assert launch_floor_ms(tables) == pytest.approx(0.0043, abs=0.0003)
    assert np.isnan(launch_floor_ms({k: v for k, v in tables.items() if k != "bench/ceilings.csv"}))


def test_a_ten_percent_slowdown_of_a_bandwidth_bound_cell_is_flagged(pair, tmp_path):
    slowed = tmp_path / "slowed"
    shutil.copytree(pair[1], slowed)
    _slow_down(slowed, SLOW_CELL, 1.10)
    flagged = regressions(compare_runs(ResultsIndex(pair[0]), ResultsIndex(slowed)))
    assert len(flagged) == 1, flagged[["artifact", "impl", "size", "dtype", "change_pct"]]
    row = flagged.iloc[0]
    assert row["verdict"] == SLOWER and (row["impl"], str(row["size"]), row["dtype"]) == ("native", "268435456", "fp32")
    assert row["change_pct"] == pytest.approx(10.0, abs=1.5)
