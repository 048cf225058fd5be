"""Snakemake script of rule bench_cell: one (target, op, implementation) over all sizes and dtypes."""

from gpulab.workflow.step import Step, run, start_inductor


def main(step: Step) -> None:
    from gpulab.bench.impls import needs_extension, needs_inductor
    from gpulab.bench.runner import bench_cell_job

    op, impl = step.wildcards.op, step.wildcards.impl
    if needs_inductor(impl):
        start_inductor()
    if needs_extension(impl):  # the cell loads exactly the library the build step's manifest names
        from gpulab.native import load_from_manifest

        manifest = step.input.extension
        load_from_manifest(manifest if isinstance(manifest, str) else manifest[0])
    table = bench_cell_job(
        op, impl, bench_config={**step.params.bench, "sizes": step.params.sizes}, timing_config=step.params.timing,
        target=step.target, fingerprint=step.fingerprint, ceilings_path=step.input.ceilings,
        out_path=step.output[0],
    )
    step.show(table, ["size", "dtype", "status", "rel_err", "median_ms", "gbps", "pct_of_ceiling", "stable", "reason"])


run(snakemake, main)
