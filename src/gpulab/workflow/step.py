"""The one preamble of every Snakemake script: the job's log, its CPUs, its target's environment, its fingerprint.

A script under ``workflow/scripts/`` is ``run(snakemake, main)``; ``main(step)`` does the step's work with
the rule's inputs, outputs and params through :class:`Step`. Imports that start a GPU runtime (torch and
everything built on it) belong inside ``main``: the target's variables (``HSA_OVERRIDE_GFX_VERSION``...) must
be set before, and :func:`run` sets them first. The rows of a job that measures get its ``host_load``.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, MutableMapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from gpulab.core.cores import confine_job, current_load, stamp_host_load, start_load_meter
from gpulab.core.device import expect_device
from gpulab.core.device_lock import arm_device_claim, start_waits_record
from gpulab.core.logs import to_log
from gpulab.core.paths import compiler_cache_env
from gpulab.workflow.cluster import apply_target_env
from gpulab.workflow.failures import EXIT_RECORD

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Step:
    """One job of a rule, as its script sees it."""

    def __init__(self, snakemake: Any) -> None:
        self.snakemake = snakemake
        self.input = snakemake.input
        self.output = snakemake.output
        self.params = snakemake.params
        self.wildcards = snakemake.wildcards

    @property
    def target(self) -> str:
        return str(self.wildcards.target)

    @cached_property
    def fingerprint(self) -> str:
        """The environment fingerprint of ``results/<target>/env/env.json`` (the rule's ``env`` input)."""
        from gpulab.env.capture import read_fingerprint

        return read_fingerprint(self.input.env)

    def timing(self) -> Any:
        from gpulab.core.timing import TimingSettings

        return TimingSettings.from_config(self.params.timing)

    def show(self, table: Any, columns: Sequence[str]) -> None:
        """The step's table in its log, the columns a reader looks at first."""
        print(table[[c for c in columns if c in table.columns]].to_string(index=False))


def use_compiler_caches(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point Triton and Inductor at the workflow's persistent caches (``.cache/triton``, ``.cache/inductor``).

    Their defaults live under /tmp, lost with the machine; kept in ``.cache/`` a rerun after editing one kernel
    recompiles only that kernel. A variable already set (by the user, or a target's ``env``) is left alone.
    Returns the variables set.
    """
    environ = os.environ if environ is None else environ
    added = {name: value for name, value in compiler_cache_env().items() if name not in environ}
    environ.update(added)
    return added


def start_inductor() -> None:
    """Import torch.compile's Inductor (1.6 s on the CI machine), which the first compile would otherwise import
    after the job claimed the device (gpulab.core.device_lock). Its compile workers still start at that compile,
    under the
    claim: 16 fresh interpreters importing PyTorch at once would take the host's cores from another job's
    measurements. Only where a GPU driver is: on a CPU the imports are what its compiles would do anyway."""
    from gpulab.core.device import gpu_driver_present

    if gpu_driver_present():
        from torch._inductor.compile_fx import compile_fx  # noqa: F401


def run(snakemake: Any, main: Callable[[Step], None]) -> None:
    """Log to the rule's log, point the compilers at the persistent caches, export the target's environment
    (jobs with a ``target`` wildcard), run ``main`` in a child process (:func:`run_watched`) and, when it
    succeeded, keep the job's tables and log in the target's history (gpulab.core.history)."""
    # First, before any import starts threads: off the run's measuring CPUs until this job claims the device.
    confine_job()
    to_log(snakemake.log[0])
    start_waits_record(snakemake.log[0])
    # when the job's script began, before PyTorch's import: the log's later lines show what startup cost
    logging.getLogger(__name__).info("job of rule %s started", getattr(snakemake, "rule", "?"))
    use_compiler_caches()
    target = getattr(snakemake.wildcards, "target", None)
    if target is not None:
        apply_target_env(snakemake.config, target)

    def body() -> None:
        start_load_meter()
        env_json = getattr(snakemake.input, "env", None)
        if holds_gpu(snakemake):
            arm_device_claim()
            if env_json:
                expect_device(env_json)
        main(Step(snakemake))
        if env_json:  # a job on the target's machine (aggregates and the report keep their inputs' loads)
            stamp_host_load(snakemake.output, current_load())

    code = run_watched(body)
    if code != 0:
        raise SystemExit(code)
    if target is not None and snakemake.config.get("results_dir"):
        from gpulab.core.history import current_run_id, record, record_job

        target_dir = os.path.join(snakemake.config["results_dir"], str(target))
        run_id = current_run_id(snakemake.config)
        record(target_dir, run_id, [*snakemake.output, *snakemake.log])
        record_job(target_dir, run_id, Path(snakemake.log[0]).stem, snakemake.output, snakemake.input)


def run_watched(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child and return its exit status (0: success). However the child ends (an
    exception, ``sys.exit``, ``os._exit``, a signal, the kernel's OOM killer) this process is still there to
    write why in the log (:data:`gpulab.workflow.failures.EXIT_RECORD`): a process cannot report its own SIGKILL."""
    sys.stdout.flush()
    sys.stderr.flush()
    oom_before = oom_kills()
    pid = os.fork()
    if pid == 0:  # the child: run the step, end with its status
        os._exit(_child(body))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"{EXIT_RECORD}{describe_exit(code, oom_before, oom_kills())}", flush=True)
    return code if code > 0 else 128 - code if code < 0 else 0


def _die_with_parent() -> None:
    """Linux: end this process when its parent (the job Snakemake started, and may cancel) ends."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _child(body: Callable[[], None]) -> int:
    _die_with_parent()
    faulthandler.enable()  # a crash in native code (SIGSEGV, SIGBUS...) leaves the Python stack in the log
    try:
        body()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{frame.filename}:{frame.lineno} in {frame.name}"
            print(f"SystemExit({exc.code!r}) raised at {where}, without a traceback", file=sys.stderr)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def describe_exit(code: int, oom_before: int | None = None, oom_after: int | None = None) -> str:
    """An exit status as a reader wants it: the code or the signal, and an OOM kill where the cgroup counted one."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        text = f"was killed by {name} (signal {-code})"
    else:
        text = f"exited with code {code}"
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        text += (f"; the kernel's OOM killer ended a process of this job (cgroup memory.events oom_kill "
                 f"{oom_before} -> {oom_after}): it ran out of host memory")
    elif code == -signal.SIGKILL:
        text += ("; the job's cgroup counted no OOM kill" if oom_after is not None else
                 "; no cgroup memory counters here to tell an OOM kill from another SIGKILL")
    return text


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer ended in this process's cgroup (v2 ``memory.events``), or None
    where that is not readable."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            group = next((line.split("::", 1)[1].strip() for line in fh if line.startswith("0::")), None)
        if group is None:
            return None
        with open(f"/sys/fs/cgroup{group}/memory.events", encoding="utf-8") as fh:
            counts = dict(line.split() for line in fh if line.strip())
        return int(counts.get("oom_kill", 0))
    except (OSError, ValueError):
        return None


def holds_gpu(snakemake: Any) -> bool:
    """Whether the job holds the ``gpu`` resource (its first look at a GPU then claims the device: device_lock.py)."""
    try:
        return int(getattr(getattr(snakemake, "resources", None), "gpu", 0) or 0) > 0
    except (TypeError, ValueError):
        return False
