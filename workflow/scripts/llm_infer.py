"""Snakemake script of rule llm_infer: one model through one engine (gpulab.llm.bench)."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402
from gpulab.llm.probe import apply_aotriton_env  # noqa: E402

# Both before PyTorch starts: the target's variables and the study's AOTriton switch change what it does.
apply_target_env(snakemake.config, snakemake.wildcards.target)
print(f"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL={apply_aotriton_env(snakemake.params.llm['aotriton_experimental'])}")

from pathlib import Path  # noqa: E402

from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.llm.bench import run_llm  # noqa: E402
from gpulab.llm.models import ResolvedModel, model_slug  # noqa: E402
from gpulab.llm.roofline import read_ceiling  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402

resolved = ResolvedModel.read(snakemake.input.model)
assert model_slug(resolved.spec) == snakemake.wildcards.model, "model file does not belong to this job"
engine = snakemake.wildcards.engine
llm = snakemake.params.llm
rows = run_llm(
    resolved,
    engine,
    llm,
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    ceiling=read_ceiling(snakemake.input.ceilings, llm["dtype"]),
    out_dir=Path(snakemake.output.csv).parent,
)
enforce_strict(rows, snakemake.params.strict, f"llm_infer {resolved.spec} {engine}")
