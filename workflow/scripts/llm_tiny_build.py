"""Snakemake script of rule llm_tiny_build: thin wrapper over gpulab.llm.tiny."""

import json
from pathlib import Path

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.llm.tiny import build_tiny

    path = build_tiny(step.output[0], seed=int(step.params.seed))
    print(f"tiny model written to {path}: {json.loads((Path(path) / 'gpulab_tiny.json').read_text())}")


run(snakemake, main)
