"""Snakemake script of rule llm_infer: one model through one engine (gpulab.llm.bench)."""

from pathlib import Path

from gpulab.step import Step, run


def main(step: Step) -> None:
    from gpulab.llm.probe import apply_aotriton_env

    # Before PyTorch starts (the step runner has set the target's variables): the study's AOTriton switch.
    print(f"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL={apply_aotriton_env(step.params.llm['aotriton_experimental'])}")
    from gpulab.llm.bench import run_llm
    from gpulab.llm.models import ResolvedModel, model_slug
    from gpulab.llm.roofline import read_ceiling

    resolved = ResolvedModel.read(step.input.model)
    if model_slug(resolved.spec) != step.wildcards.model:
        raise SystemExit(f"{step.input.model} describes {resolved.spec}, not this job's model {step.wildcards.model}")
    engine, llm = step.wildcards.engine, step.params.llm
    rows = run_llm(resolved, engine, llm, target=step.target, fingerprint=step.fingerprint,
                   ceiling=read_ceiling(step.input.ceilings, llm["dtype"]), out_dir=Path(step.output.csv).parent)
    step.strict(rows, f"llm_infer {resolved.spec} {engine}")


run(snakemake, main)
