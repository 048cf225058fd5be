"""Snakemake script of rule outcomes_record: every step's not-ok outcomes in one table (gpulab.workflow.outcomes)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.workflow.outcomes import record

    record(step.params.tables, step.params.results_dir, step.params.unstable, step.output[0])


run(snakemake, main)
