"""Compile jobs' worker processes (gpulab.core.parallel) and how many a job may use (gpulab.core.jobenv)."""

from __future__ import annotations

import os

import pytest

from gpulab.core.jobenv import STATE_VAR, cpu_workers, mark_serial_run
from gpulab.core.parallel import run_all


def test_run_all_keeps_order_and_uses_other_processes_for_closures() -> None:
    state = {"offset": 100}  # a closure over this process's state: never pickled, inherited by the fork
    tasks = [lambda i=i: (i + state["offset"], os.getpid()) for i in range(6)]
    results = run_all(tasks, workers=2)
    assert [r[0] for r in results] == list(range(100, 106))
    assert os.getpid() not in {pid for _, pid in results}
    assert run_all(tasks, workers=1) == [(i + 100, os.getpid()) for i in range(6)]


def test_a_task_that_raises_fails_the_call() -> None:
    def boom() -> None:
        raise ValueError("compiler exploded")

    with pytest.raises(ValueError, match="compiler exploded"):
        run_all([lambda: 1, boom], workers=2)


def test_cpu_workers_every_core_only_in_a_serial_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STATE_VAR, raising=False)
    mark_serial_run(False)
    assert cpu_workers(1) == 1 and cpu_workers(3) == 3
    mark_serial_run(True)
    assert cpu_workers(1) == len(os.sched_getaffinity(0))
    mark_serial_run(False)
    assert STATE_VAR not in os.environ
