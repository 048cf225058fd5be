"""gpulab.core.history: kept runs, a run's state, restoring a last good table, and ``gpulab history``/``compare``
on kept runs of recorded tables."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from gpulab.cli import main as gpulab_main
from gpulab.core import history
from gpulab.core.timing import format_blocks, parse_blocks

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "bench" / "local"


def _step(target_dir: Path, run_id: str, rel: str, source: Path) -> Path:
    path = target_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, path)
    history.record(target_dir, run_id, [path])
    return path


@pytest.fixture
def kept(tmp_path) -> Path:
    """results/local with two runs: the first measured everything, the second only gelu again (slower)."""
    target = tmp_path / "results" / "local"
    first, second = "20261125T100000Z__aaaaaaa__111111111111", "20261125T110000Z__bbbbbbb+dirty__222222222222"
    for rel in ("env/env.json", "bench/gelu.csv", "bench/add.csv", "bench/ceilings.csv"):
        _step(target, first, rel, FIXTURE / rel)
    slower = pd.read_csv(FIXTURE / "bench/gelu.csv")
    slower["times_ms"] = [format_blocks([2 * b for b in parse_blocks(v)]) for v in slower["times_ms"]]
    slower["median_ms"] *= 2
    slower.to_csv(tmp_path / "gelu_slow.csv", index=False)
    _step(target, second, "bench/gelu.csv", tmp_path / "gelu_slow.csv")
    return target


def test_runs_are_listed_oldest_first_with_time_commit_and_digest(kept):
    runs = history.runs(kept)
    assert [r.commit for r in runs] == ["aaaaaaa", "bbbbbbb+dirty"]
    assert runs[1].config_digest == "222222222222" and runs[1].time.hour == 11
    assert history.find_run(kept, "-1") == runs[1] and history.find_run(kept, "20261125T10") == runs[0]
    with pytest.raises(LookupError, match="is ambiguous"):
        history.find_run(kept, "20261125T1")


def test_the_state_after_a_run_holds_each_tables_latest_copy(kept, tmp_path):
    state = history.state_at(kept, history.runs(kept)[1], tmp_path / "state") / "local"
    assert {p.relative_to(state).as_posix() for p in state.rglob("*.csv")} == {
        "bench/gelu.csv", "bench/add.csv", "bench/ceilings.csv"}
    assert pd.read_csv(state / "bench/gelu.csv")["median_ms"].equals(pd.read_csv(kept / "bench/gelu.csv")["median_ms"])


def test_a_missing_table_gets_its_last_good_copy_back_marked_stale(kept):
    (kept / "bench/add.csv").unlink()
    lines = history.restore_failed(kept.parent, [str(kept / "bench/add.csv"), str(kept / "bench/gelu.csv")])
    assert len(lines) == 1 and "kept the last good table (run 20261125T100000Z__aaaaaaa" in lines[0]
    assert (kept / "bench/add.csv").read_bytes() == (FIXTURE / "bench/add.csv").read_bytes()
    assert os.stat(kept / "bench/add.csv").st_mtime == history.STALE_MTIME  # older than any input: measured again
    assert history.restored(kept)["bench/add.csv"]["why"] == "its re-measurement failed"
    history.record(kept, "20261125T120000Z__ccccccc__333333333333", [kept / "bench/add.csv"])
    assert history.restored(kept) == {}  # measured again: no longer stale


def test_an_interrupted_tables_snakemake_marker_brings_its_copy_back(kept, tmp_path, monkeypatch):
    from base64 import urlsafe_b64encode

    monkeypatch.chdir(tmp_path)
    (kept / "bench/gelu.csv").unlink()
    marker = tmp_path / ".snakemake" / "incomplete" / urlsafe_b64encode(b"results/local/bench/gelu.csv").decode()
    marker.parent.mkdir(parents=True)
    marker.write_text('{"external_jobid": null}')
    assert history.incomplete_outputs() == ["results/local/bench/gelu.csv"]
    lines = history.restore_interrupted("results")
    assert len(lines) == 1 and "interrupted; kept the last good table (run 20261125T110000Z__bbbbbbb+dirty" in lines[0]
    assert (kept / "bench/gelu.csv").read_bytes() == (tmp_path / "gelu_slow.csv").read_bytes()


def test_gpulab_history_lists_the_runs(kept, capsys):
    assert gpulab_main(["history", str(kept.parent)]) == 0
    out = capsys.readouterr().out
    assert "local: 2 run(s) kept" in out and "20261125T110000Z__bbbbbbb+dirty__222222222222" in out
    with pytest.raises(SystemExit, match=r"no target .nope."):
        gpulab_main(["history", str(kept.parent), "--target", "nope"])


def test_gpulab_compare_takes_two_kept_runs(kept, tmp_path, capsys):
    out = tmp_path / "compare.html"
    code = gpulab_main(["compare", f"{kept}@-2", f"{kept}@-1", "-o", str(out), "--fail-on", "regression"])
    err = capsys.readouterr().err
    assert code == 1, err  # gelu twice as slow in the second run
    assert "slower local bench/gelu.csv" in err and "bench/add.csv" not in err.split("cells:")[1]
    assert "local@20261125T110000Z__bbbbbbb+dirty__222222222222 against local@20261125T100000Z" in out.read_text()
    with pytest.raises(SystemExit, match="matches no run"):
        gpulab_main(["compare", f"{kept}@1999", f"{kept}@-1", "-o", str(out)])


def test_a_table_older_than_a_table_its_job_read_is_stale(kept):
    run = history.runs(kept)[-1].id
    cell = kept / "bench/cells/gelu__native.csv"
    cell.parent.mkdir(parents=True)
    cell.write_text("measured before the aggregate\n")
    os.utime(cell, (1, 1))
    history.record_job(kept, run, "bench_aggregate_gelu", [kept / "bench/gelu.csv"], [cell, "src/gpulab/x.py"])
    assert history.stale(kept) == {}
    cell.write_text("measured again, the aggregate not rebuilt\n")
    assert history.stale(kept) == {"bench/gelu.csv": "older than its input bench/cells/gelu__native.csv"}
