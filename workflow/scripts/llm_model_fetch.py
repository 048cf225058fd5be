"""Snakemake script of rule llm_model_fetch (a local rule: downloads happen on the submitting host)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.core.tables import write_atomic
    from gpulab.llm.models import resolve_model

    tiny = step.input.get("tiny") or None  # only tiny and random: models use it
    resolved = resolve_model(step.params.spec, step.params.llm, tiny_dir=tiny)
    print(f"{resolved.spec}: {resolved.source} weights, {resolved.how}, at {resolved.path}")
    write_atomic(step.output[0], resolved.to_json())


run(snakemake, main)
