"""Snakemake script of rule llm_infer: one model through every configured engine (gpulab.llm.bench)."""

import math
from pathlib import Path

from gpulab.workflow.step import Step, run, start_inductor

# The ceilings job measured the device, not the CPU this job may measure instead (llm.tiny_device).
NO_CPU_CEILING = "none: measured on the host CPU beside the device jobs (llm.tiny_device), the ceilings on the device"


def main(step: Step) -> None:
    from gpulab.core.device import hide_gpus
    from gpulab.llm.probe import apply_aotriton_env

    # Before PyTorch starts (the step runner has set the target's variables): the device, the AOTriton switch.
    if step.params.on_cpu:
        hide_gpus("llm.tiny_device: the tiny model runs on the host CPU beside the device jobs")
    print(f"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL={apply_aotriton_env(step.params.llm['aotriton_experimental'])}")
    import torch

    from gpulab.llm.bench import run_llm
    from gpulab.llm.models import ResolvedModel, model_slug
    from gpulab.llm.roofline import Ceiling, read_ceiling

    if step.params.on_cpu:
        torch.set_num_threads(step.snakemake.threads)  # the cores it was granted, not the device jobs' too
    else:
        start_inductor()  # the fast engines' compiled steps
    resolved = ResolvedModel.read(step.input.model)
    if model_slug(resolved.spec) != step.wildcards.model:
        raise SystemExit(f"{step.input.model} describes {resolved.spec}, not this job's model {step.wildcards.model}")
    engines, llm = step.params.engines, step.params.llm
    ceiling = Ceiling(math.nan, NO_CPU_CEILING) if step.params.on_cpu else \
        read_ceiling(step.input.ceilings, llm["dtype"])
    run_llm(resolved, engines, llm, target=step.target, fingerprint=step.fingerprint, ceiling=ceiling,
            out_dir=Path(step.output.csv[0]).parent)


run(snakemake, main)
