"""Snakemake script of rule kernels_aggregate: the per-architecture tables in one kernel_resources.csv."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.core.tables import write_atomic
    from gpulab.toolchains import KERNEL_RESOURCES, aggregate

    table = aggregate(step.input.cells)
    write_atomic(step.output[0], table[KERNEL_RESOURCES.names].to_csv(index=False))
    print(table.groupby(["arch", "status"]).size().to_string())


run(snakemake, main)
