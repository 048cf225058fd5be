"""Snakemake script of rule timing_pitfalls: thin wrapper over gpulab.timing_pitfalls."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from pathlib import Path  # noqa: E402

from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402
from gpulab.timing import TimingSettings  # noqa: E402
from gpulab.timing_pitfalls import PITFALLS, run_pitfalls  # noqa: E402

rows = run_pitfalls(
    snakemake.wildcards.target,
    read_fingerprint(snakemake.input.env),
    TimingSettings.from_config(snakemake.params.timing),
    manifest=Path(snakemake.input.manifest),
)
table = PITFALLS.write(rows, snakemake.output[0])
print(table[["method", "impl", "call_order", "status", "ms", "speedup_vs_native", "reason"]].to_string(index=False))
enforce_strict(table, snakemake.params.strict, "timing_pitfalls")
