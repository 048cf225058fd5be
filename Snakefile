from snakemake.utils import min_version

import sys

# This checkout's gpulab, whatever else is installed: the workflow runs the code it ships.
sys.path.insert(0, f"{workflow.basedir}/src")

from gpulab.workflow import hooks

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


# The config validated and checked against the device; a killed run's tables put back (gpulab.workflow.hooks).
RUN = hooks.start(workflow, config)


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


onsuccess:
    hooks.on_success(RUN)


# The last good tables and page back in place, one summary of every step that did not finish, the page again.
onerror:
    hooks.on_error(RUN, log, refresh_report)


rule all:
    default_target: True
    input:
        config["report"]["output"],
        step_outputs(),
        # Every not-ok outcome; with strict on, its judgement (workflow/rules/outcomes.smk).
        outcome_outputs(),
