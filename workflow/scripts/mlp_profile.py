"""Snakemake script of rule mlp_profile: thin wrapper over gpulab.mlp.profile."""

from pathlib import Path

from gpulab.step import Step, run, start_inductor


def main(step: Step) -> None:
    from gpulab.ceilings import Ceilings
    from gpulab.mlp.profile import profile_mlp, strict_rows

    start_inductor()  # the compiled variants

    summary = profile_mlp(
        step.params.mlp, step.timing(), target=step.target, fingerprint=step.fingerprint,
        ceilings=Ceilings.load(step.input.ceilings), out_dir=Path(step.output.summary).parent,
    )
    step.show(summary, ["variant", "status", "reason", "median_ms", "tflops", "pct_of_ceiling"])
    step.strict(strict_rows(summary), "mlp_profile (variants this backend has)")


run(snakemake, main)
