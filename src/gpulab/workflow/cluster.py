"""Cluster placement of gpulab jobs: what a job of one target asks Slurm for, and its environment.

Config ``targets:`` names machine classes (``mi300x``, ``h100``...). A job that measures on a target's
device runs on that class's partition with its GPUs. Resource names are the ones
snakemake-executor-plugin-slurm reads: ``slurm_partition``, ``slurm_account``, ``gpu``, ``gpu_model``,
``runtime`` (minutes) and ``mem_mb``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

Resource = str | int | None
ResourceValue = Resource | Callable[..., Resource]

# Placement keys that must be set for every target or for none: a target left out would silently lose
# the profile's default-resources value (Snakemake treats a rule resource of None as unset, not default).
ALL_OR_NONE = {"partition": "slurm_partition", "account": "slurm_account"}


class TargetConfigError(ValueError):
    """``targets:`` cannot be turned into consistent Slurm requests; the message says which key to fix."""


def target_job_resources(config: Mapping[str, Any], target: str, attempt: int = 1) -> dict[str, Resource]:
    """Slurm resources of one device job of ``target`` (a name under ``targets:``).

    ``runtime`` grows with the attempt so that ``--retries`` gives a job killed at its time limit room
    to finish.
    """
    targets = config.get("targets") or {}
    if target not in targets:
        configured = ", ".join(sorted(targets)) or "none"
        raise TargetConfigError(f"target {target!r} is not configured under targets (configured: {configured})")
    spec = targets[target]
    gpus = int(spec["gpus"])
    return {
        "slurm_partition": spec["partition"],
        "slurm_account": spec["account"],
        "gpu": gpus,
        # The plugin turns gpu_model into --gpus=<model>:<n>, and into one GPU when gpu is 0.
        "gpu_model": spec["gpu_model"] if gpus else None,
        "runtime": int(spec["runtime_min"]) * max(1, int(attempt)),
        "mem_mb": int(spec["mem_mb"]),
    }


def check_targets(targets: Mapping[str, Mapping[str, Any]]) -> None:
    """Reject ``targets:`` whose placement would be half taken from the targets, half from the profile."""
    problems = []
    for key in ALL_OR_NONE:
        unset = sorted(name for name, spec in targets.items() if not spec.get(key))
        if unset and len(unset) < len(targets):
            problems.append(
                f"targets.{unset[0]}.{key} is not set while other targets set theirs: set {key} for every "
                f"target ({', '.join(unset)} lack it), or for none to use the profile's default-resources"
            )
    if problems:
        raise TargetConfigError("; ".join(problems))


def device_job_resources(config: Mapping[str, Any]) -> dict[str, ResourceValue]:
    """The ``resources:`` of every rule whose jobs measure on a target's device.

    Without ``targets:`` (a plain run of ``target``) a job asks for one GPU and everything else comes from
    the profile's ``default-resources``. With ``targets:`` each job asks for its target's partition,
    GPUs, time and memory; partition and account stay with the profile when no target sets them.
    """
    targets = config.get("targets") or {}
    if not targets:
        return {"gpu": 1}
    check_targets(targets)

    def per_target(key: str) -> Callable[..., Resource]:
        def resource(wildcards: Any, attempt: int = 1) -> Resource:
            return target_job_resources(config, wildcards.target, attempt)[key]

        resource.__name__ = f"target_{key}"
        return resource

    keys = ["gpu", "gpu_model", "runtime", "mem_mb"]
    keys += [res for key, res in ALL_OR_NONE.items() if any(spec.get(key) for spec in targets.values())]
    return {key: per_target(key) for key in keys}


def without_gpu_where(resources: Mapping[str, ResourceValue], on_host: Callable[[Any], bool]
                      ) -> dict[str, ResourceValue]:
    """``resources`` of a device rule, except that its jobs for which ``on_host(wildcards)`` holds ask for no
    GPU (they measure the host CPU beside the device jobs: ``llm.tiny_device``)."""

    def wrap(key: str, value: ResourceValue) -> Callable[..., Resource]:
        def resource(wildcards: Any, attempt: int = 1) -> Resource:
            if key == "gpu" and on_host(wildcards):
                return 0
            return value(wildcards, attempt) if callable(value) else value

        resource.__name__ = f"host_or_{key}"
        return resource

    return {key: wrap(key, value) for key, value in resources.items()}


def target_environment(config: Mapping[str, Any], target: str) -> dict[str, str]:
    """Extra environment variables of ``target``'s jobs (``targets.<target>.env``); none if not listed."""
    spec = (config.get("targets") or {}).get(target)
    return dict(spec["env"]) if spec else {}


def apply_target_env(
    config: Mapping[str, Any], target: str, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Export ``target``'s extra environment into this process, before any GPU runtime starts.

    Slurm jobs inherit the submitting shell's environment (the plugin submits with ``--export=ALL`` and
    refuses ``--export`` in ``slurm_extra``), so one invocation serving several targets cannot set
    per-target variables at submission; each job sets its own. The target's value wins over an inherited
    one; every variable set is printed to the job's log. Returns the variables set.
    """
    environ = os.environ if environ is None else environ
    extra = target_environment(config, target)
    for name, value in extra.items():
        previous = environ.get(name)
        note = "" if previous in (None, value) else f" (replaces inherited {previous!r})"
        print(f"target {target}: {name}={value}{note}")
        environ[name] = value
    return extra
