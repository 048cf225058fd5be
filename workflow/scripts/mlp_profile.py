"""Snakemake script of rule mlp_profile: thin wrapper over gpulab.mlp.profile."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from pathlib import Path  # noqa: E402

from gpulab.ceilings import Ceilings  # noqa: E402
from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.mlp.profile import profile_mlp, strict_rows  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402
from gpulab.timing import TimingSettings  # noqa: E402

summary = profile_mlp(
    snakemake.params.mlp,
    TimingSettings.from_config(snakemake.params.timing),
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    ceilings=Ceilings.load(snakemake.input.ceilings),
    out_dir=Path(snakemake.output.summary).parent,
)
print(summary[["variant", "status", "reason", "median_ms", "tflops", "pct_of_ceiling"]].to_string(index=False))
enforce_strict(strict_rows(summary), snakemake.params.strict, "mlp_profile (variants this backend has)")
