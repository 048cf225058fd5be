"""A full disk loses nothing: ``gpulab report`` ends with one line and keeps the old page, a table put back after a
failed re-measurement takes no space (a hard link) and never raises, the last good page goes back where a render
did not complete, and the failure summary prints whatever the put-back met.

The full disk is the kernel's: a write to ``/dev/full`` fails with ENOSPC, as on a filesystem with no space left.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpulab.cli import main as gpulab_main
from gpulab.core import history
from gpulab.workflow import hooks, pages

CPU_RUN = Path(__file__).resolve().parent / "fixtures" / "report" / "results" / "cpu"
KEPT = ("env/env.json", "mlp/summary.csv", "bench/gelu.csv")
RUN = "20261201T100000Z__e368919__1bc052714c90"


@pytest.fixture
def full_disk(monkeypatch):
    """Every file written beside its destination (then moved over it) is written to /dev/full."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, path = real(*args, **kwargs)
        os.close(fd)
        os.unlink(path)
        return os.open("/dev/full", os.O_WRONLY), path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def kept(tmp_path) -> Path:
    """Target ``local`` of a results directory with one kept run holding the recorded CPU run's tables."""
    target = tmp_path / "results" / "local"
    for rel in KEPT:
        for dest in (target / rel, history.history_dir(target) / RUN / rel):
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(CPU_RUN / rel, dest)
    return target


def test_gpulab_report_on_a_full_disk_ends_with_one_line_and_keeps_the_page(kept, tmp_path, full_disk, capsys):
    page = tmp_path / "reports" / "report.html"
    page.parent.mkdir()
    page.write_text("<p>the last good page</p>")
    assert gpulab_main(["report", str(kept.parent), "-o", str(page)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpulab report: [Errno 28] No space left on device") and "\n" not in err, err
    assert "Traceback" not in err
    assert page.read_text() == "<p>the last good page</p>"
    assert [p.name for p in page.parent.iterdir()] == ["report.html"]  # nothing half-written left beside it


def test_a_table_put_back_on_a_full_disk_is_a_hard_link_to_its_kept_copy(kept, monkeypatch):
    table = kept / "bench/gelu.csv"
    table.unlink()
    monkeypatch.setattr(history.shutil, "copy2", no_space)
    (line,) = history.restore_failed(kept.parent, [str(table)])
    assert f"its re-measurement failed; kept the last good table (run {RUN}), marked stale" in line
    copy = history.history_dir(kept) / RUN / "bench/gelu.csv"
    assert table.read_bytes() == (CPU_RUN / "bench/gelu.csv").read_bytes() and os.path.samefile(table, copy)
    assert table.stat().st_mtime == history.STALE_MTIME


def test_a_table_that_cannot_be_put_back_is_said_and_nothing_raises(kept, monkeypatch):
    table = kept / "bench/gelu.csv"
    table.unlink()
    monkeypatch.setattr(history.shutil, "copy2", no_space)
    monkeypatch.setattr(history.os, "link", no_space)
    (line,) = history.restore_failed(kept.parent, [str(table)], history.INTERRUPTED)
    assert line.startswith(f"{table}: its re-measurement was interrupted; its last good table could not be put "
                           "back ([Errno 28] No space left on device)"), line
    assert "the next run measures it again" in line
    assert not table.exists() and not list(table.parent.glob(".*.tmp"))


def test_a_put_back_changes_the_steps_params_once(kept):
    """The stamp Snakemake's params trigger compares: new when a table is put back, unchanged once measured."""
    table = kept / "bench/gelu.csv"
    before = history.put_back_stamp(kept.parent, [table])
    table.unlink()
    history.restore_failed(kept.parent, [str(table)])
    put_back = history.put_back_stamp(kept.parent, [table])
    assert put_back != before and put_back.startswith("bench/gelu.csv@")
    history.record(kept, "20261201T110000Z__e368919__1bc052714c90", [table])  # measured again
    assert history.restored(kept) == {}
    assert history.put_back_stamp(kept.parent, [table]) == put_back


def test_the_last_good_page_goes_back_where_its_render_did_not_complete(tmp_path):
    page = tmp_path / "report.html"
    page.write_text("<p>good</p>")
    pages.keep(page)
    before = pages.stamp(page)
    page.unlink()  # what Snakemake does before the render runs
    assert "the last good page is back in place and the next run renders it again" in pages.put_back(page)
    assert page.read_text() == "<p>good</p>" and page.stat().st_mtime == history.STALE_MTIME
    assert pages.stamp(page) != before
    assert pages.put_back(page) is None  # in place: nothing to do


def test_a_failed_run_on_a_full_disk_prints_its_summary(kept, tmp_path, monkeypatch, capsys):
    table = kept / "bench/gelu.csv"
    table.unlink()
    log = kept / "logs" / "bench_aggregate_gelu.log"
    log.parent.mkdir()
    log.write_text("Traceback (most recent call last):\n  File x\nOSError: [Errno 28] No space left on device\n")
    run_log = tmp_path / "snakemake.log"
    run_log.write_text(f"Error in rule bench_aggregate:\n    jobid: 3\n    output: {table}\n    log: {log} (check log "
                       "file(s) for error details)\n")
    monkeypatch.setattr(history.shutil, "copy2", no_space)
    monkeypatch.setattr(history.os, "link", no_space)
    monkeypatch.chdir(tmp_path)
    run = hooks.Run(str(kept.parent), ["local"], str(tmp_path / "report.html"))
    hooks.on_error(run, str(run_log), lambda: pytest.fail("no table was put back: nothing to render again"))
    err = capsys.readouterr().err
    assert "its last good table could not be put back ([Errno 28]" in err
    assert "gpulab: 1 step(s) failed (reasons from their logs):" in err
    assert "OSError: [Errno 28] No space left on device" in err
