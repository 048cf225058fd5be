"""Snakemake script of rule tune_triton_table: the ops' candidate tables as tune/triton.csv."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.bench.tune import TUNE_TRITON, aggregate
    from gpulab.core.tables import write_atomic

    table = aggregate(step.input.ops)
    write_atomic(step.output[0], table[TUNE_TRITON.names].to_csv(index=False))
    print(table.groupby(["op", "status"]).size().to_string())


run(snakemake, main)
