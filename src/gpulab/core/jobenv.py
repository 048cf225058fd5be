"""Process environment every job of the workflow inherits (set once, when the Snakefile is parsed)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path


def prepare(workflow_basedir: str | Path, argv: Sequence[str]) -> None:
    # Jobs import gpulab from this checkout, whatever gpulab is installed (another clone's, a wheel, none).
    package_root = str(Path(workflow_basedir) / "src")
    current = os.environ.get("PYTHONPATH", "")
    if package_root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, current) if p)
    # The report names the exact command; kept out of params so it never triggers reruns.
    os.environ.setdefault("GPULAB_COMMAND", shlex.join(["snakemake", *argv[1:]]))


# Set by the Snakefile when a local run executes one job at a time (--cores 1).
SERIAL_RUN_VAR = "GPULAB_SERIAL_RUN"


def mark_serial_run(serial: bool) -> None:
    """Tell the jobs whether nothing runs beside them (read by :func:`cpu_workers`)."""
    if serial:
        os.environ[SERIAL_RUN_VAR] = "1"
    else:
        os.environ.pop(SERIAL_RUN_VAR, None)


def available_cores() -> int:
    """Cores this process may run on (a cluster job's allocation, where it has one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def cpu_workers(threads: int = 1) -> int:
    """Processes a CPU job that measures nothing (compiles, the report) may run at once: every core this process
    may use when the run is serial, since no other job shares the machine then (as a measurement on a machine
    without a GPU takes every core); else the ``threads`` Snakemake granted, so side-by-side jobs do not
    oversubscribe."""
    return available_cores() if os.environ.get(SERIAL_RUN_VAR) == "1" else max(1, threads)
