"""Snakemake script of rule bench_aggregate: the cells of one op concatenated into bench/<op>.csv."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.bench.runner import BENCH, aggregate  # noqa: E402
from gpulab.tables import write_atomic  # noqa: E402

table = aggregate(snakemake.input.cells)  # the other inputs are its source files
write_atomic(snakemake.output[0], table[BENCH.names].to_csv(index=False))
print(table.groupby(["impl", "status"]).size().to_string())
