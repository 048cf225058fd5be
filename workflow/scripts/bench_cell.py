"""Snakemake script of rule bench_cell: one (target, op, implementation) over all sizes and dtypes."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from gpulab.bench.runner import bench_cell_job  # noqa: E402
from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402

params = snakemake.params
op, impl = snakemake.wildcards.op, snakemake.wildcards.impl
extension = snakemake.input.get("extension")  # cpp_ext cells only: the build step's manifest
if extension:
    from gpulab.build import load_from_manifest

    load_from_manifest(extension if isinstance(extension, str) else extension[0])
table = bench_cell_job(
    op,
    impl,
    bench_config={**params.bench, "sizes": params.sizes},
    timing_config=params.timing,
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    ceilings_path=snakemake.input.ceilings,
    out_path=snakemake.output[0],
)
columns = ["size", "dtype", "status", "rel_err", "median_ms", "gbps", "pct_of_ceiling", "stable", "reason"]
print(table[columns].to_string(index=False))
enforce_strict(table, params.strict, f"bench {op}/{impl}")
