"""The one preamble of every Snakemake script: the job's log, its target's environment, its fingerprint.

A script under ``workflow/scripts/`` is ``run(snakemake, main)``; ``main(step)`` does the step's work with
the rule's inputs, outputs and params through :class:`Step`. Imports that start a GPU runtime (torch and
everything built on it) belong inside ``main``: the target's variables (``HSA_OVERRIDE_GFX_VERSION``...) must
be set before, and :func:`run` sets them first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, MutableMapping, Sequence
from functools import cached_property
from typing import Any

from gpulab.cluster import apply_target_env
from gpulab.device_lock import arm_device_claim, start_waits_record
from gpulab.logs import to_log
from gpulab.paths import compiler_cache_env


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
        from gpulab.env_capture import read_fingerprint

        return read_fingerprint(self.input.env)

    def timing(self) -> Any:
        from gpulab.timing import TimingSettings

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
    after the job claimed the device (gpulab.device_lock). Its compile workers still start at that compile, under the
    claim: 16 fresh interpreters importing PyTorch at once would take the host's cores from another job's
    measurements. Only where a GPU driver is: on a CPU the imports are what its compiles would do anyway."""
    from gpulab.device import gpu_driver_present

    if gpu_driver_present():
        from torch._inductor.compile_fx import compile_fx  # noqa: F401


def run(snakemake: Any, main: Callable[[Step], None]) -> None:
    """Log to the rule's log, point the compilers at the persistent caches, export the target's environment
    (jobs with a ``target`` wildcard), run ``main``."""
    to_log(snakemake.log[0])
    start_waits_record(snakemake.log[0])
    # when the job's script began, before PyTorch's import: the log's later lines show what startup cost
    logging.getLogger(__name__).info("job of rule %s started", getattr(snakemake, "rule", "?"))
    use_compiler_caches()
    target = getattr(snakemake.wildcards, "target", None)
    if target is not None:
        apply_target_env(snakemake.config, target)
    if holds_gpu(snakemake):
        arm_device_claim()
    main(Step(snakemake))


def holds_gpu(snakemake: Any) -> bool:
    """Whether the job holds the ``gpu`` resource (its first look at a GPU then claims the device: device_lock.py)."""
    try:
        return int(getattr(getattr(snakemake, "resources", None), "gpu", 0) or 0) > 0
    except (TypeError, ValueError):
        return False
