"""The cross-job device lock of a local run, and the record of each job's waits for it.

Device jobs start together but measure one at a time: a job takes the lock when it first detects the GPU and keeps it
until it exits (jobs holding the ``gpu`` resource only; a child claims with ``--claim-device``). Every claim appends
a JSON line to the job's wait record (the run state's ``device_waits``), which the report reads to tell a job's wait
from its work.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpulab.core import jobenv
from gpulab.core.cores import enter_measuring

log = logging.getLogger(__name__)

WAITS_DIR = "device_waits"
_CLAIM: dict[str, Any] = {"armed": False, "file": None}


def device_lock_path(environ: Mapping[str, str] | None = None) -> str:
    """The lock of this user's runs on the devices this process sees (one per CUDA/HIP_VISIBLE_DEVICES value):
    two runs on one GPU do not measure at once either, runs pinned to different GPUs do not wait for each other."""
    env = os.environ if environ is None else environ
    visible = "-".join(env.get(name, "all") for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"))
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", visible)
    return os.path.join(tempfile.gettempdir(), f"gpulab-device-{os.getuid()}-{safe}.lock")


def waits_path(log_path: str | os.PathLike[str]) -> Path:
    """The wait record of the job whose log is ``results/<target>/logs/<job>.log``:
    ``results/<target>/device_waits/<job>.jsonl``."""
    log_file = Path(log_path)
    return log_file.parent.parent / WAITS_DIR / f"{log_file.stem}.jsonl"


def start_waits_record(log_path: str | os.PathLike[str]) -> Path:
    """Point this job (and its child processes) at a fresh wait record beside its log's directory (written at the
    first claim: a job that never claims the device leaves none)."""
    path = waits_path(log_path)
    path.unlink(missing_ok=True)
    jobenv.put("device_waits", os.path.abspath(path))
    return path


def arm_device_claim() -> None:
    """Make this process's first detection of a GPU claim the device (a job holding the ``gpu`` resource)."""
    _CLAIM["armed"] = True


def claim_armed() -> bool:
    return bool(_CLAIM["armed"])


def claim_device(path: str | None = None) -> float | None:
    """Wait until no other job holds the device lock, then hold it until this process exits, on the run's measuring
    CPUs (gpulab.core.cores); returns the seconds waited (recorded in the job's wait record), or None where there is no
    lock (cluster runs, CPU-only machines) or this process holds it already."""
    path = path or jobenv.get("device_lock")
    if not path or _CLAIM["file"] is not None:
        return None
    start = time.monotonic()
    handle = open(path, "a")  # noqa: SIM115 - held open, and so locked, as long as the process
    fcntl.flock(handle, fcntl.LOCK_EX)
    _CLAIM["file"] = handle
    waited = time.monotonic() - start
    enter_measuring()  # the run's measuring CPUs (gpulab.core.cores): no other job's work shares them from here on
    log.info("device claimed after waiting %.2f s for the measurements of another job", waited)
    _record_wait(waited)
    return waited


def child_should_claim() -> bool:
    """Whether a child process this one starts should claim the device itself: not while this process holds it
    (the child would wait for its own parent)."""
    return _CLAIM["file"] is None


def _record_wait(waited: float) -> None:
    record = jobenv.get("device_waits")
    if not record:
        return
    line = json.dumps({"pid": os.getpid(), "claimed_at": time.time(), "waited_s": waited})
    Path(record).parent.mkdir(parents=True, exist_ok=True)
    with open(record, "a", encoding="utf-8") as fh:  # one short append per claim: whole lines, even from children
        fh.write(line + "\n")


def read_waits(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The claims of one job's wait record (none where the job never claimed the device)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def waited_s(claims: Iterable[Mapping[str, Any]]) -> float:
    """Seconds a job waited for the device: the union of its claims' waits, as a job's child processes may wait
    at once (0 where it never waited: no lock, or no GPU)."""
    spans = sorted((float(c["claimed_at"]) - float(c["waited_s"]), float(c["claimed_at"])) for c in claims)
    total, reach = 0.0, -math.inf
    for begin, end in spans:
        total += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    return total
