from snakemake.utils import min_version

import os
import sys
import time

# This checkout's gpulab, whatever else is installed: the workflow runs the code it ships.
sys.path.insert(0, f"{workflow.basedir}/src")

from gpulab.workflow.config import validate_config
from gpulab.workflow.preflight import check as preflight, runtime_overrides
from gpulab.workflow.failures import failed_jobs, failure_summary, log_offsets
from gpulab.core import history

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


# Validated (and defaults filled) before any job runs; a bad key fails here, naming it. Settings whose tensors
# or run time cannot fit the device fail here too, with the estimate and the limit (gpulab.workflow.preflight).
config.update(validate_config(config))
if workflow.is_main_process:
    preflight(
        config,
        runtime=runtime_overrides(workflow.resource_settings.overwrite_resources),
    )


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/mlp.smk"
include: "workflow/rules/llm.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/outcomes.smk"


# What the step logs hold before this run: on error, only what the run added is summarised.
LOG_OFFSETS = log_offsets(RESULTS)
RUN_STARTED = time.time()

if workflow.is_main_process:
    # One run name for every job of this invocation: their tables are kept under it (gpulab.core.history).
    os.environ.setdefault(
        history.RUN_ID_VAR, history.new_run_id(config, workflow.basedir)
    )
    # A killed run's half-measured tables: the last good ones go back in place and are measured again.
    for line in history.restore_interrupted(RESULTS) or history.stale_notice(
        RESULTS, TARGETS
    ):
        print(f"gpulab: {line}", file=sys.stderr)


onsuccess:
    history.record_benchmarks(RESULTS, os.environ[history.RUN_ID_VAR], RUN_STARTED)


onerror:
    run_id = os.environ[history.RUN_ID_VAR]
    history.record_benchmarks(RESULTS, run_id, RUN_STARTED)
    # Snakemake removed the failed jobs' outputs: their last good tables go back, marked stale and incomplete
    # (Snakemake's own marker: the next run measures them again).
    failed = [out for job in failed_jobs(log) for out in job.outputs]
    restored = history.restore_failed(
        RESULTS,
        failed,
        lambda path: workflow.persistence._mark_incomplete(path, None),
    )
    for line in restored:
        print(f"gpulab: {line}", file=sys.stderr)
    # One list of every failing step and its reason (with keep-going, from the default profile: all of them).
    summary = failure_summary(RESULTS, LOG_OFFSETS, log)
    if summary:
        print(summary, file=sys.stderr)
    if restored:
        # Imported here: the report's libraries stay out of every parse of the Snakefile.
        from gpulab.report.render import refresh_after_failure

        refreshed = refresh_after_failure(RESULTS, config)
    else:
        refreshed = None
    if refreshed:
        print(f"gpulab: {refreshed}", file=sys.stderr)


rule all:
    default_target: True
    input:
        config["report"]["output"],
        step_outputs(),
        # Strict mode's judgement of every recorded outcome (workflow/rules/outcomes.smk).
        OUTCOMES if config["strict"] else [],
