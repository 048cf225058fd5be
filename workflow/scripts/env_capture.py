"""Snakemake script of rule env_capture: thin wrapper over gpulab.env.capture.

The step runner exports the target's variables first: they (e.g. HSA_OVERRIDE_GFX_VERSION) change what
device detection reports.
"""

from pathlib import Path

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.env.capture import TOOLS, capture

    env = capture(Path(step.output.env).parent, target=step.target, timeout_s=step.params.timeout_s)
    print(f"fingerprint {env['fingerprint']}: {env['device']['backend']} / {env['device']['name']}")
    step.show(TOOLS.read(step.output.tools), ["tool", "required", "status", "reason"])


run(snakemake, main)
