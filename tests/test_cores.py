"""The core split (gpulab.core.cores): the job measuring on the device keeps its CPUs; the host load on its rows."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from gpulab.core import cores, jobenv
from gpulab.core.device_lock import claim_device
from gpulab.core.tables import Column, TableSchema


def fake_sysfs(root, siblings):
    """A /sys/devices/system/cpu with each CPU's SMT siblings."""
    for cpu, text in siblings.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(text + "\n")
    return root


@pytest.fixture
def smt16(tmp_path):
    """16 CPUs, 8 physical cores: CPU i and i+8 are siblings (the usual numbering of a 16-vCPU host)."""
    return fake_sysfs(tmp_path / "cpu", {i: f"{i % 8},{i % 8 + 8}" for i in range(16)})


def test_a_16_cpu_host_keeps_whole_cores_for_the_measurement(smt16):
    measuring = cores.split(range(16), "auto", smt16)
    assert measuring == {6, 7, 14, 15}
    rest = set(range(16)) - measuring
    assert all({c % 8, c % 8 + 8} <= rest for c in rest), "another job would share a core with the measurement"


def test_cpus_without_a_readable_topology_are_cores_of_their_own(tmp_path):
    assert cores.split(range(16), "auto", tmp_path / "none") == {12, 13, 14, 15}
    assert cores.split(range(16), 3, tmp_path / "none") == {13, 14, 15}


@pytest.mark.parametrize("setting, available, kept", [
    ("auto", 16, 4), ("auto", 8, 2), ("auto", 2, 1), (6, 16, 6), (16, 16, 15), (4, 2, 1), ("auto", 1, 0)])
def test_the_measuring_job_keeps_what_measure_cores_says_and_leaves_one(setting, available, kept):
    assert cores.measure_count(setting, available) == kept
    assert len(cores.split(range(available), setting, Path("/nonexistent"))) == kept


def test_one_smt_core_is_split_rather_than_given_whole_to_the_measurement(tmp_path):
    sysfs = fake_sysfs(tmp_path / "cpu", {0: "0-1", 1: "0-1"})
    assert cores.split({0, 1}, "auto", sysfs) == {1}


@pytest.mark.parametrize("allowed", [range(16), range(2), [0, 1, 2, 3, 8, 9, 10, 11]])
def test_two_jobs_beside_each_other_never_share_a_cpu(allowed, smt16):
    measuring = cores.split(allowed, "auto", smt16)
    measures = cores.job_cpus(allowed, measuring, measures=True)
    beside = cores.job_cpus(allowed, measuring, measures=False)
    assert measures == measuring and not measures & beside and measures | beside == set(allowed)


def test_a_job_never_leaves_its_allocation():
    # A Slurm job's allocation (its affinity) that holds none of the named CPUs: it keeps its own.
    allocation = {4, 5, 6, 7}
    assert cores.job_cpus(allocation, {12, 13}, measures=True) == allocation
    assert cores.job_cpus(allocation, {12, 13}, measures=False) == allocation
    assert cores.job_cpus(allocation, {6, 7}, measures=True) == {6, 7}


def test_a_run_without_jobs_beside_the_measurement_names_no_cpus():
    # A cluster run, a CPU-only host (whose measurement takes every core), one job at a time.
    environ: dict[str, str] = {}
    jobenv.put("measure_cores", "1", environ)  # left by an earlier run in the same shell
    assert cores.plan("auto", enabled=False, environ=environ, cpus={0, 1}) == frozenset()
    assert jobenv.STATE_VAR not in environ
    assert cores.confine_job(environ) is None and cores.enter_measuring(environ) is None


def test_a_local_gpu_run_names_its_measuring_cpus_for_its_jobs(smt16):
    environ: dict[str, str] = {}
    assert cores.plan(4, enabled=True, environ=environ, cpus=range(16), sysfs=smt16) == {6, 7, 14, 15}
    assert jobenv.get("measure_cores", environ) == "6,7,14,15"
    assert cores.measuring_cpus(environ) == {6, 7, 14, 15}
    assert cores.parse_cpus("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}


def in_child(body):
    """``body()``'s JSON result from a forked process: affinity changes stay out of the test process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = body()
        except BaseException as exc:  # reported to the parent
            result = {"error": repr(exc)}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    return json.loads(text)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_a_job_waits_beside_and_measures_alone_on_the_real_cpus(monkeypatch, tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    measuring = {allowed[-1]}
    monkeypatch.setattr(os, "environ", dict(os.environ))
    jobenv.put("measure_cores", cores.format_cpus(measuring))

    def body():
        started = sorted(cores.confine_job())
        confined = sorted(os.sched_getaffinity(0))
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()  # a thread started before the claim (PyTorch's, a compiler's) moves with the process
        claim_device(str(tmp_path / "device.lock"))
        claimed = [sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(thread.native_id))]
        stop.set()
        thread.join()
        metered = sorted(cores._METER["meter"].cpus)
        return {"started": started, "confined": confined, "claimed": claimed, "metered": metered}

    seen = in_child(body)
    beside = sorted(set(allowed) - measuring)
    assert seen == {"started": beside, "confined": beside, "claimed": [sorted(measuring), sorted(measuring)],
                    "metered": allowed}  # the host load counts every CPU of the run, not the job's own only


STAT = """cpu  300 0 100 1600 20 0 0 0 0 0
cpu0 100 0 50 800 10 0 0 0 0 0
cpu1 200 0 50 800 10 0 0 0 0 0
intr 1 2 3

ctxt 5
"""


def test_cpu_times_count_iowait_as_idle():
    assert cores.read_cpu_times(STAT) == {0: (150, 960), 1: (250, 1060)}


def fake_meter(before, after, own_s, cpus=(0, 1)):
    ticks = iter([before, after])
    own = iter(own_s)
    return cores.LoadMeter(cpus, cpu_times=lambda: next(ticks), own=lambda: next(own), ticks_per_s=100)


def test_host_load_is_the_busy_share_of_other_processes():
    # 2 CPUs over 10 s (2000 ticks): 600 busy ticks, 100 of them (1 s) this job's own.
    meter = fake_meter({0: (100, 1000), 1: (100, 1000)}, {0: (600, 2000), 1: (200, 2000)}, [5.0, 6.0])
    assert meter.load() == pytest.approx(0.25)


def test_a_quiet_host_reads_zero_and_no_elapsed_tick_reads_nothing():
    quiet = fake_meter({0: (0, 0), 1: (0, 0)}, {0: (100, 1000), 1: (0, 1000)}, [0.0, 1.2])
    assert quiet.load() == 0.0
    assert fake_meter({0: (5, 9)}, {0: (5, 9)}, [0.0, 0.0], cpus=[0]).load() is None


def test_the_meter_counts_only_the_runs_cpus():
    meter = fake_meter({0: (0, 0), 1: (0, 0), 2: (0, 0)}, {0: (0, 100), 1: (100, 100), 2: (100, 100)},
                       [0.0, 0.0], cpus=[0, 1])
    assert meter.load() == pytest.approx(0.5)


MEASURED = TableSchema("t", (Column("op", "str"), Column("note", "str")), measured=True)


def test_the_load_goes_on_the_measured_rows_and_every_other_cell_stays(tmp_path):
    path = tmp_path / "t.csv"
    MEASURED.write([{"target": "h200", "fingerprint": "ab12", "status": "ok", "op": "add", "note": 'a, "b"',
                     "median_ms": 0.1234567890123, "reps": 10, "stable": True},
                    {"target": "h200", "fingerprint": "ab12", "status": "skipped", "reason": "no GPU", "op": "gelu",
                     "note": ""}], path)
    before = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert cores.stamp_host_load([path, tmp_path / "trace.json.gz"], 0.4321) == [path]
    after = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert after["host_load"].tolist() == ["0.432", ""]
    pd.testing.assert_frame_equal(after.drop(columns="host_load"), before.drop(columns="host_load"))
    assert MEASURED.read(path)["host_load"].tolist()[0] == pytest.approx(0.432)
    # A table that carries loads already (an aggregate of measured cells) keeps them.
    assert cores.stamp_host_load([path], 0.9) == []
    assert pd.read_csv(path)["host_load"].tolist()[0] == pytest.approx(0.432)


def test_tables_without_the_column_and_an_unknown_load_are_left_alone(tmp_path):
    plain = TableSchema("p", (Column("op", "str"),))
    path = tmp_path / "p.csv"
    plain.write([{"target": "h200", "fingerprint": "ab12", "status": "ok", "op": "add"}], path)
    text = path.read_text()
    assert cores.stamp_host_load([path], 0.5) == [] and path.read_text() == text
    assert cores.stamp_host_load([path], None) == []


def test_older_tables_read_back_with_an_empty_host_load(tmp_path):
    path = tmp_path / "old.csv"
    MEASURED.write([{"target": "h100", "fingerprint": "ab12", "status": "ok", "op": "add", "median_ms": 1.0}], path)
    pd.read_csv(path).drop(columns="host_load").to_csv(path, index=False)
    assert MEASURED.read(path)["host_load"].isna().all()
