"""Snakemake script of rule llm_model_fetch (a local rule: downloads happen on the submitting host)."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.llm.models import resolve_model  # noqa: E402
from gpulab.tables import write_atomic  # noqa: E402

tiny = snakemake.input.get("tiny") or None  # only tiny and random: models use it
resolved = resolve_model(snakemake.params.spec, snakemake.params.llm, tiny_dir=tiny)
print(f"{resolved.spec}: {resolved.source} weights, {resolved.how}, at {resolved.path}")
write_atomic(snakemake.output[0], resolved.to_json())
