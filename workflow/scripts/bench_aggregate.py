"""Snakemake script of rule bench_aggregate: the cells of one op concatenated into bench/<op>.csv."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.bench.runner import BENCH, aggregate
    from gpulab.core.tables import write_atomic

    # Every op's cells: one ceiling per pattern, dtype and size for all the tables.
    table = aggregate(step.input.cells, op=step.wildcards.op)
    write_atomic(step.output[0], table[BENCH.names].to_csv(index=False))
    print(table.groupby(["impl", "status"]).size().to_string())


run(snakemake, main)
