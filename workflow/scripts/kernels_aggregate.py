"""Snakemake script of rule kernels_aggregate: the per-architecture tables in one kernel_resources.csv."""

from gpulab.step import Step, run


def main(step: Step) -> None:
    from gpulab.kernel_compile import KERNEL_RESOURCES, aggregate
    from gpulab.tables import write_atomic

    table = aggregate(step.input.cells)
    write_atomic(step.output[0], table[KERNEL_RESOURCES.names].to_csv(index=False))
    print(table.groupby(["arch", "status"]).size().to_string())


run(snakemake, main)
