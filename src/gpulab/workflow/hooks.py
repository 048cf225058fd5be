"""The Snakefile's hooks: what a run does before its jobs, and after them when it succeeds or fails."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulab.core import history, jobenv
from gpulab.workflow import pages
from gpulab.workflow.config import run_targets, validate_config
from gpulab.workflow.failures import failed_jobs, failure_summary, interrupted, log_offsets
from gpulab.workflow.preflight import check as preflight
from gpulab.workflow.preflight import runtime_overrides


@dataclass
class Run:
    """What one invocation's hooks share: where its results and page are, and what its step logs held before."""

    results: str
    targets: list[str]
    page: str
    started: float = field(default_factory=time.time)
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)


def say(lines: Iterable[str | None]) -> None:
    for line in lines:
        if line:
            print(line if line.startswith("gpulab") else f"gpulab: {line}", file=sys.stderr)


def start(workflow: Any, config: dict[str, Any]) -> Run:
    """Validate the configuration (defaults filled, a bad key named) and, in the run's main process, check that
    it fits the device (gpulab.workflow.preflight), name the run and put back what a killed run left missing."""
    config.update(validate_config(config))
    run = Run(config["results_dir"], run_targets(config), config["report"]["output"])
    run.offsets = log_offsets(run.results)  # on error, only what this run added to the step logs is summarised
    if workflow.is_main_process:
        preflight(config, runtime=runtime_overrides(workflow.resource_settings.overwrite_resources))
        if not jobenv.get("run_id"):
            jobenv.put("run_id", history.new_run_id(config, workflow.basedir))
        say(history.restore_interrupted(run.results) or history.stale_notice(run.results, run.targets))
        say([pages.put_back(run.page) or pages.keep(run.page)])
    return run


def on_success(run: Run) -> None:
    history.record_benchmarks(run.results, jobenv.get("run_id"), run.started)


def _guarded(what: str, body: Callable[[], Any]) -> Any:
    """``body()``; an error becomes one line, so the other parts of the failure handling still run."""
    try:
        return body()
    except Exception as exc:
        say([f"{what} failed ({type(exc).__name__}: {exc})"])
        return None


def on_error(run: Run, log: str, refresh: Callable[[], str | None]) -> None:
    """After a failed or interrupted run: the last good tables and page back in place (Snakemake removed the
    outputs of the jobs that did not finish), one summary of every such step, and the page rendered again
    (``refresh``) where tables were put back. Never raises."""
    stopped = interrupted(log)
    _guarded("keeping the jobs' benchmark records",
             lambda: history.record_benchmarks(run.results, jobenv.get("run_id"), run.started))
    outputs = [out for job in failed_jobs(log) for out in job.outputs]
    if stopped:
        outputs += _guarded("reading Snakemake's incomplete markers", history.incomplete_outputs) or []
    why = history.INTERRUPTED if stopped else history.FAILED
    restored = _guarded("putting the last good tables back",
                        lambda: history.restore_failed(run.results, dict.fromkeys(outputs), why)) or []
    say([*restored, pages.put_back(run.page)])
    say([_guarded("the failure summary", lambda: failure_summary(run.results, run.offsets, log))])
    # Snakemake removed every output listed: a table there now was put back.
    if any(Path(out).is_file() for out in outputs if out != run.page):
        say([_guarded("rendering the report again", refresh)])
