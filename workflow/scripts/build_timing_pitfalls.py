"""Snakemake script of rule timing_pitfalls: thin wrapper over gpulab.native.timing_pitfalls."""

from pathlib import Path

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.native.timing_pitfalls import PITFALLS, run_pitfalls

    rows = run_pitfalls(step.target, step.fingerprint, step.timing(), manifest=Path(step.input.manifest))
    table = PITFALLS.write(rows, step.output[0])
    step.show(table, ["method", "impl", "call_order", "status", "ms", "speedup_vs_native", "reason"])


run(snakemake, main)
