"""Snakemake script of rule extension_build: thin wrapper over gpulab.native.step."""

from pathlib import Path

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.native.checks import EXTENSION_CHECKS
    from gpulab.native.step import EXTENSION, run_extension_step

    # A compile error raises here, after printing the compiler's output to this log.
    run_extension_step(
        step.target, step.fingerprint,
        {"offload_archs": step.params.offload_archs, "extra_cflags": step.params.extra_cflags},
        out_csv=Path(step.output.csv), checks_csv=Path(step.output.checks),
        build_log=Path(step.output.build_log), manifest=Path(step.output.manifest),
    )
    builds = EXTENSION.read(step.output.csv)
    step.show(builds, ["phase", "status", "backend", "arch", "compiler", "seconds", "cached", "reason"])
    checks = EXTENSION_CHECKS.read(step.output.checks)
    step.show(checks, ["kind", "case", "op", "dtype", "status", "rel_err", "reason"])


run(snakemake, main)
