from snakemake.utils import min_version

from gpulab.config import validate_config

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


rule all:
    default_target: True
    input:
        config["report"]["output"],
        step_outputs(),
