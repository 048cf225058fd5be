"""Snakemake script of rule tune_triton_op: every Triton launch candidate of one op (gpulab.bench.tune)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.bench.tune import tune_triton_job

    table = tune_triton_job(
        step.wildcards.op, bench_config={**step.params.bench, "sizes": step.params.sizes},
        timing_config=step.params.timing, target=step.target, fingerprint=step.fingerprint,
        ceilings_path=step.input.ceilings, out_path=step.output[0],
    )
    step.show(table, ["size", "dtype", "config", "picked", "fastest", "status", "median_ms", "gbps", "pct_of_ceiling",
                      "reason"])


run(snakemake, main)
