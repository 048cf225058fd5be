from __future__ import annotations

import math
import os

import pandas as pd
import pytest
from gpulab.tables import Column, SchemaError, StrictModeError, TableSchema, enforce_strict, write_atomic
from gpulab.timing import TIMING_COLUMNS, TimingSettings, measure, summarize


def test_summarize_statistics():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats["median_ms"] == 3.0
    assert stats["min_ms"] == 1.0
    assert stats["p10_ms"] == pytest.approx(1.4)
    assert stats["p90_ms"] == pytest.approx(61.6)
    assert stats["cv"] == pytest.approx(pd.Series([1, 2, 3, 4, 100.0]).std() / 22.0)


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])


def test_measure_counts_calls_and_honours_minimums():
    calls = []
    settings = TimingSettings(min_time_s=0.01, min_reps=7, max_reps=50, warmup_reps=2, flush_cache=False)
    timing = measure(lambda: calls.append(1), settings)
    assert 7 <= timing.reps <= 50
    assert len(calls) == timing.reps + settings.warmup_reps
    assert timing.timer == "perf_counter" and timing.cache_policy == "none"
    assert set(timing.as_row()) == set(TIMING_COLUMNS)


def test_measure_reports_first_call_separately():
    import time

    state = {"first": True}

    def slow_first():
        if state["first"]:
            state["first"] = False
            time.sleep(0.05)

    timing = measure(slow_first, TimingSettings(min_time_s=0.001, min_reps=5, flush_cache=False))
    assert timing.first_call_ms >= 50
    assert timing.median_ms < 5


def test_measure_rotates_inputs():
    seen = []
    fns = [lambda i=i: seen.append(i) for i in range(3)]
    timing = measure(fns, TimingSettings(min_time_s=0.001, min_reps=6, max_reps=6, warmup_reps=1, flush_cache=True))
    assert set(seen) == {0, 1, 2}
    assert timing.cache_policy == "flush+rotate:3"


SCHEMA = TableSchema("demo", (Column("op", "str"), Column("size", "int")), measured=True)


def test_schema_rejects_undeclared_and_bad_status(tmp_path):
    with pytest.raises(SchemaError, match="undeclared"):
        SCHEMA.frame([{"target": "t", "fingerprint": "f", "status": "ok", "nope": 1}])
    with pytest.raises(SchemaError, match="status"):
        SCHEMA.frame([{"target": "t", "fingerprint": "f", "status": "great"}])
    with pytest.raises(SchemaError, match="lacks"):
        SCHEMA.frame([{"target": "t", "status": "ok"}])


def test_schema_round_trip_keeps_ints(tmp_path):
    path = tmp_path / "x.csv"
    SCHEMA.write(
        [
            {"target": "t", "fingerprint": "f", "status": "ok", "op": "gelu", "size": 3},
            {"target": "t", "fingerprint": "f", "status": "skipped", "reason": "no GPU", "op": "gelu"},
        ],
        path,
    )
    df = SCHEMA.read(path)
    assert list(df.columns) == SCHEMA.names
    assert "3," in path.read_text() and "3.0" not in path.read_text()
    assert math.isnan(df["median_ms"].iloc[0])


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    class Boom(str):
        def __len__(self):
            raise RuntimeError("boom")

    target = tmp_path / "a.txt"
    write_atomic(target, "ok")
    assert target.read_text() == "ok"
    assert oct(os.stat(target).st_mode & 0o777) != "0o600"
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "b.txt", 42)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_enforce_strict():
    rows = [{"status": "ok", "op": "gelu"}, {"status": "skipped", "reason": "no GPU", "op": "softmax"}]
    enforce_strict(rows, strict=False, what="demo")
    with pytest.raises(StrictModeError, match=r"skipped: no GPU \[op=softmax\]"):
        enforce_strict(rows, strict=True, what="demo")


def test_measure_caps_wall_time_once_min_reps_are_done():
    import time

    settings = TimingSettings(min_time_s=10.0, min_reps=5, max_reps=1000, max_wall_s=0.05, flush_cache=False)
    start = time.perf_counter()
    timing = measure(lambda: time.sleep(0.002), settings)
    assert timing.reps >= 5
    assert time.perf_counter() - start < 1.0
