"""Snakemake script of rule outcomes_check: strict mode's judgement of every outcome (gpulab.workflow.outcomes)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.workflow.outcomes import judge

    judge(step.input[0], step.params.strict, step.output[0])


run(snakemake, main)
