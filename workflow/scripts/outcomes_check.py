"""Snakemake script of rule outcomes_check: strict mode's one judgement of every recorded outcome (gpulab.outcomes)."""

from gpulab.step import Step, run


def main(step: Step) -> None:
    from gpulab.outcomes import check

    check(step.params.tables, step.params.results_dir, step.params.strict, step.output[0])


run(snakemake, main)
