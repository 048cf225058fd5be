"""Snakemake script of rule kernels_aggregate: the per-architecture tables in one kernel_resources.csv."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.kernel_compile import KERNEL_RESOURCES, aggregate  # noqa: E402
from gpulab.tables import write_atomic  # noqa: E402

table = aggregate(snakemake.input.cells)
write_atomic(snakemake.output[0], table[KERNEL_RESOURCES.names].to_csv(index=False))
print(table.groupby(["arch", "status"]).size().to_string())
