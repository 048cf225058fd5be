import sys

from gpulab.cluster import device_job_resources
from gpulab.config import config_hash, run_targets
from gpulab.jobenv import prepare

prepare(workflow.basedir, sys.argv)
CONDA_ENV = "../../env/conda.yaml"

RESULTS = config["results_dir"]
TARGETS = run_targets(config)
CONFIG_HASH = config_hash(config)

# Every step registers the artifacts it produces for all targets; `all` and the report depend on them.
STEP_OUTPUTS = {}


wildcard_constraints:
    target=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


def register_outputs(step, paths):
    STEP_OUTPUTS[step] = list(paths)


def step_outputs(exclude=()):
    return [
        p for step, paths in STEP_OUTPUTS.items() if step not in exclude for p in paths
    ]


def result(path):
    """Path pattern of an artifact under results/<target>/."""
    return f"{RESULTS}/{{target}}/{path}"


def log_of(name):
    return f"{RESULTS}/{{target}}/logs/{name}.log"


def env_json(wildcards):
    return f"{RESULTS}/{wildcards.target}/env/env.json"


# `resources: **gpu_resources` in each step whose jobs run on a target's device. Through
# the Slurm profile each job asks for its target's partition, GPUs, time and memory (gpulab.cluster);
# local runs ignore them. The scripts of these rules call gpulab.cluster.apply_target_env first.
gpu_resources = device_job_resources(config)


# Jobs that run on the submitting host, never on a compute node. Each rule file lists its own CPU-only
# steps the same way: aggregation, the report, model downloads (compute nodes often have no internet).
localrules:
    all,
    report_render,
