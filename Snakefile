from snakemake.utils import min_version

from gpulab.config import validate_config

min_version("9.0")


configfile: "config.yaml"


# Validated (and defaults filled) before any job runs; a bad key fails here, naming it.
config.update(validate_config(config))


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        config["report"]["output"],
        step_outputs(),
    default_target: True
