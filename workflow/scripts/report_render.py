"""Snakemake script of rule report_render: thin wrapper over gpulab.report.render."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

import os  # noqa: E402

from gpulab.report.render import render_report  # noqa: E402

command = os.environ.get("GPULAB_COMMAND", "snakemake --cores 1")
# Underscore keys are the workflow's facts, not configuration (the methodology section reads them, never shows them).
config = {**snakemake.params.config, "_workflow": {"rule_outputs": snakemake.params.rule_outputs}}
report = render_report(snakemake.params.results_dir, snakemake.output[0], config, command)
print(f"report written to {report.path} ({report.size_bytes / 2**20:.2f} MB, {len(report.sections)} sections)")
for error in report.errors:
    print(f"section {error['id']} could not be rendered: {error['message']}")
