from snakemake.utils import min_version

import sys

# This checkout's gpulab, whatever else is installed: the workflow runs the code it ships.
sys.path.insert(0, f"{workflow.basedir}/src")

from gpulab.config import validate_config
from gpulab.failures import failure_summary, log_offsets

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


# Validated (and defaults filled) before any job runs; a bad key fails here, naming it.
config.update(validate_config(config))


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


onerror:
    # One list of every failing step and its reason (with keep-going, from the default profile: all of them).
    summary = failure_summary(RESULTS, LOG_OFFSETS)
    if summary:
        print(summary, file=sys.stderr)


rule all:
    default_target: True
    input:
        config["report"]["output"],
        step_outputs(),
        # Strict mode's judgement of every recorded outcome (workflow/rules/outcomes.smk).
        OUTCOMES if config["strict"] else [],
