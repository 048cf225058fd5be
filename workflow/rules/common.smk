import os
import re
import sys
from pathlib import Path

from gpulab.workflow.cluster import device_job_resources, target_environment
from gpulab.workflow.config import run_targets
from gpulab.core.device import gpu_driver_present
from gpulab.core import history, jobenv
from gpulab.core.device_lock import device_lock_path
from gpulab.core.jobenv import mark_serial_run, prepare
from gpulab.workflow.sources import code_digest, kernel_sources, step_sources

prepare(workflow.basedir, sys.argv)

RESULTS = config["results_dir"]
TARGETS = run_targets(config)

# Every step registers the artifacts it produces for all targets; `all` and the report depend on them.
STEP_OUTPUTS = {}


# Only this invocation's targets are made here. Another machine's target copied in beside them is read by the
# report and never re-measured, even when a plain copy leaves its inputs newer than its outputs.
wildcard_constraints:
    target="|".join(re.escape(name) for name in TARGETS),


def register_outputs(step, paths):
    STEP_OUTPUTS[step] = list(paths)


# Every step's recorded outcome tables, by step: strict mode's one judgement (outcomes.smk) reads them all.
OUTCOME_TABLES = {}


def register_outcomes(step, paths):
    OUTCOME_TABLES[step] = list(paths)


def step_outputs(exclude=()):
    return [
        p for step, paths in STEP_OUTPUTS.items() if step not in exclude for p in paths
    ]


def result(path):
    """Path pattern of an artifact under results/<target>/."""
    return f"{RESULTS}/{{target}}/{path}"


def log_of(name):
    return f"{RESULTS}/{{target}}/logs/{name}.log"


def benchmark_of(name):
    """Snakemake's `benchmark:` record of one job (wall time, memory, CPU; with the default profile's
    benchmark-extended also its params and inputs), read by the report's methodology section.
    """
    return f"{RESULTS}/{{target}}/benchmarks/{name}.jsonl"


CHECKOUT = Path(workflow.basedir)


def code(script, *files):
    """A `params:` entry: the content digest of the code the step runs, i.e. workflow/scripts/<script>, the gpulab
    modules it imports at any depth and the data files it reads (gpulab.workflow.sources), plus `files` (repository-relative).
    A step reruns when this content changes; a file's time (touch, checkout round trip) or place changes nothing.
    """
    return code_digest([*step_sources(script, CHECKOUT), *files], CHECKOUT)


def cell_code(wildcards):
    """`code` of one benchmark cell: also its implementation's kernel files (e.g. kernels/triton/<op>.py), so
    editing one op's kernel reruns that op's cell only."""
    return code(
        "bench_cell.py", *kernel_sources(wildcards.impl, wildcards.op, CHECKOUT)
    )


def put_back(rule):
    """A `params:` entry of every step that writes a target's tables: it changes when a failed or interrupted run put
    one back (its last good copy, gpulab.core.history), so the next run measures it again. A function of the
    wildcards alone (Snakemake records no param derived from the output), so it names its rule.
    """

    def stamp(wildcards):
        outputs = [expand(p, **wildcards) for p in getattr(rules, rule).output]
        return history.put_back_stamp(
            RESULTS, [path for paths in outputs for path in paths]
        )

    return stamp


def target_env(wildcards):
    """A `params:` entry of each step that runs on a target's device: the target's extra environment
    (`targets.<name>.env`, exported by gpulab.workflow.step.run before the step starts), which changes what it measures.
    """
    return target_environment(config, wildcards.target)


# `resources: **gpu_resources` in each step whose jobs run on a target's device. Through
# the Slurm profile each job asks for its target's partition, GPUs, time and memory (gpulab.workflow.cluster);
# local runs ignore them. The scripts of these rules call gpulab.workflow.cluster.apply_target_env first.
gpu_resources = device_job_resources(config)


# Snakemake needs --jobs for a cluster run and takes it as --cores for a local one: without it, the run is local
# (the Snakefile is read before the executor is chosen, so this is the one sign available here).
LOCAL_RUN = workflow.nodes is None
# A local run has one device: the jobs that use it (`resources: gpu`) measure one at a time whatever --cores says,
# CPU-only jobs (compiles, the tiny model, aggregates, the report) beside them; `--resources gpu=N` overrides.
# With a GPU, three such jobs run at once and the device lock (gpulab.core.device_lock) orders their device
# work: one measures while the others start Python and their libraries and run their compilers (three: after the
# environment capture, the HIP program's and the extension's builds and the ceilings' imports all overlap). Without
# one the device jobs measure the CPU on every core (DEVICE_THREADS), so one at a time. Never on a cluster, where
# each job has its node's GPUs: a limit would throttle submissions and cap requests.
DEVICE_LOCK = LOCAL_RUN and workflow.is_main_process and gpu_driver_present()
if DEVICE_LOCK:
    jobenv.put("device_lock", device_lock_path())
if LOCAL_RUN and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 3 if DEVICE_LOCK else 1)
# `threads: DEVICE_THREADS` in the same rules. Without a GPU driver the device is the CPU: a measurement takes
# every core, so nothing runs beside it (CPU-only jobs still run beside each other).
DEVICE_THREADS = workflow.cores if LOCAL_RUN and not gpu_driver_present() else 1
# A local run with --cores 1 runs one job at a time: a CPU job that measures nothing (kernels_compile, the report)
# may then use every core (gpulab.core.jobenv.cpu_workers); otherwise it keeps to the threads it was granted.
mark_serial_run(LOCAL_RUN and workflow.cores == 1)


# Jobs that run on the submitting host, never on a compute node. Each rule file lists its own CPU-only
# steps the same way: aggregation, the report, model downloads (compute nodes often have no internet).
localrules:
    all,
    report_render,


def refresh_report():
    """The page again after a failed run put tables back (the report's libraries load only then)."""
    from gpulab.report.render import refresh_after_failure

    return refresh_after_failure(RESULTS, config)


def outcome_outputs():
    return [OUTCOMES, STRICT_VERDICT] if config["strict"] else [OUTCOMES]
