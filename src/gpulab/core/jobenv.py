"""Process environment every job of the workflow inherits: the run's state in one variable, and every variable
gpulab reads (:data:`VARIABLES`, documented in docs/guide/running.md)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

STATE_VAR = "GPULAB_STATE"
CACHE_VAR = "GPULAB_CACHE_DIR"
BROWSER_VAR = "GPULAB_CHROMIUM"
# Every environment variable gpulab reads, with its purpose.
VARIABLES = {
    STATE_VAR: "the run's state, one JSON object that jobs and their child processes inherit (keys: STATE)",
    CACHE_VAR: "moves the run's cache (compiled kernels, extensions, models) from .cache/ in the working directory",
    BROWSER_VAR: "the Chromium that `gpulab check-report` opens (a path or a command name)",
}
# The keys of STATE_VAR: each is set by one process and read by the processes it starts.
STATE = {
    "run_id": "the run every job of one invocation keeps its tables under (set by the Snakefile)",
    "command": "the command the report names (set by the Snakefile; never a param, so it triggers no rerun)",
    "serial": "the local run executes one job at a time, so a CPU job may use every core (set by the Snakefile)",
    "device_lock": "the lock file that orders the device work of a local run's jobs (set by the Snakefile)",
    "measure_cores": "the CPUs the job holding the device measures on (set by the Snakefile)",
    "device_waits": "the job's record of its waits for the device (set by the step runner)",
    "gpus_hidden": "why this process measures the CPU on a machine with a GPU (set by hide_gpus)",
}


def state(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The run's state as inherited; empty where unset or unreadable."""
    try:
        value = json.loads((os.environ if environ is None else environ).get(STATE_VAR) or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def get(key: str, environ: Mapping[str, str] | None = None) -> Any:
    """One key of the run's state (:data:`STATE`), None where unset."""
    if key not in STATE:
        raise KeyError(f"{key!r} is not a key of {STATE_VAR}; known: {', '.join(STATE)}")
    return state(environ).get(key)


def put(key: str, value: Any, environ: MutableMapping[str, str] | None = None) -> None:
    """Set (None: remove) one key of the run's state for this process and those it starts."""
    get(key, environ)  # names an unknown key
    environ = os.environ if environ is None else environ
    current = {k: v for k, v in {**state(environ), key: value}.items() if v is not None}
    if current:
        environ[STATE_VAR] = json.dumps(current, sort_keys=True)
    else:
        environ.pop(STATE_VAR, None)


def prepare(workflow_basedir: str | Path, argv: Sequence[str]) -> None:
    # Jobs import gpulab from this checkout, whatever gpulab is installed (another clone's, a wheel, none).
    package_root = str(Path(workflow_basedir) / "src")
    current = os.environ.get("PYTHONPATH", "")
    if package_root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, current) if p)
    if get("command") is None:
        put("command", shlex.join(["snakemake", *argv[1:]]))


def mark_serial_run(serial: bool) -> None:
    """Tell the jobs whether nothing runs beside them (read by :func:`cpu_workers`)."""
    put("serial", True if serial else None)


def available_cores() -> int:
    """Cores this process may run on (a cluster job's allocation, where it has one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def cpu_workers(threads: int = 1) -> int:
    """Processes a CPU job that measures nothing (compiles, the report) may run at once: every core this process
    may use when the run is serial, since no other job shares the machine then (as a measurement on a machine
    without a GPU takes every core); else the ``threads`` Snakemake granted, so side-by-side jobs do not
    oversubscribe."""
    return available_cores() if get("serial") else max(1, threads)
