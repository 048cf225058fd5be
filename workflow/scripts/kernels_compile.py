"""Snakemake script of rule kernels_compile: every kernel compiled for one architecture (no GPU needed)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.core.jobenv import cpu_workers
    from gpulab.core.tables import write_atomic
    from gpulab.toolchains.job import compile_arch

    table = compile_arch(step.wildcards.arch, tuple(step.params.dtypes), target=step.target,
                         fingerprint=step.fingerprint, sizes=step.params.sizes,
                         workers=cpu_workers(step.snakemake.threads))
    write_atomic(step.output[0], table.to_csv(index=False))
    step.show(table, ["kernel", "variant", "dtype", "status", "registers", "spilled_regs", "occupancy", "compile_s",
                      "reason"])


run(snakemake, main)
