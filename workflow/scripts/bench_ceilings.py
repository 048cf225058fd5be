"""Snakemake script of rule bench_ceilings: thin wrapper over gpulab.ceilings."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from gpulab.ceilings import CEILINGS, measure_ceilings  # noqa: E402
from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402
from gpulab.timing import TimingSettings  # noqa: E402

rows = measure_ceilings(
    snakemake.params.ceilings,
    TimingSettings.from_config(snakemake.params.timing),
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
)
table = CEILINGS.write(rows, snakemake.output[0])
print(table[["kind", "dtype", "size", "status", "gbps", "tflops", "median_ms", "reps"]].to_string(index=False))
enforce_strict(table, snakemake.params.strict, "bench_ceilings")
