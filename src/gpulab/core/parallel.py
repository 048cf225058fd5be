"""Independent CPU work of one job (compiles) spread over forked worker processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

# The tasks of the running run_all: forked workers inherit them, so only an index and a result travel.
_TASKS: list[Callable[[], Any]] = []


def _run(index: int) -> Any:
    return _TASKS[index]()


def run_all(tasks: Sequence[Callable[[], Any]], workers: int) -> list[Any]:
    """Each zero-argument task's result, in order: in this process when ``workers`` is 1, else in up to
    ``workers`` forked processes. Forked, so a task may close over this process's state (imported compilers,
    a warmed-up backend) without pickling; its result must pickle. Forking needs the caller to have started
    no threads that hold locks the children would need (compilers run in-process and subprocesses are fine)."""
    global _TASKS
    if workers <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    _TASKS = list(tasks)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=context) as pool:
            return list(pool.map(_run, range(len(tasks))))
    finally:
        _TASKS = []
