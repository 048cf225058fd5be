"""Snakemake script of rule report_render: thin wrapper over gpulab.report.render."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.core import jobenv
    from gpulab.report.render import render_report

    command = jobenv.get("command") or "snakemake --cores 1"
    # Underscore keys are the workflow's facts, not configuration (the methodology section reads them, never
    # shows them).
    config = {**step.params.config, "_workflow": {"rule_outputs": step.params.rule_outputs}}
    report = render_report(step.params.results_dir, step.output[0], config, command,
                           workers=jobenv.cpu_workers(step.snakemake.threads))
    print(f"report written to {report.path} ({report.size_bytes / 2**20:.2f} MB, {len(report.sections)} sections)")
    for error in report.errors:
        print(f"section {error['id']} could not be rendered: {error['message']}")


run(snakemake, main)
