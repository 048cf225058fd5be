"""Snakemake script of rule extension_build: thin wrapper over gpulab.build.step."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from pathlib import Path  # noqa: E402

from gpulab.build.checks import EXTENSION_CHECKS  # noqa: E402
from gpulab.build.step import EXTENSION, run_extension_step  # noqa: E402
from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402

# A compile error raises here, after printing the compiler's output to this log.
run_extension_step(
    snakemake.wildcards.target,
    read_fingerprint(snakemake.input.env),
    {"offload_archs": snakemake.params.offload_archs, "extra_cflags": snakemake.params.extra_cflags},
    out_csv=Path(snakemake.output.csv),
    checks_csv=Path(snakemake.output.checks),
    build_log=Path(snakemake.output.build_log),
    manifest=Path(snakemake.output.manifest),
)
builds = EXTENSION.read(snakemake.output.csv)
print(builds[["phase", "status", "backend", "arch", "compiler", "seconds", "cached", "reason"]].to_string(index=False))
checks = EXTENSION_CHECKS.read(snakemake.output.checks)
enforce_strict(builds, snakemake.params.strict, "extension_build")
# Without a GPU the bad-input cases that need one (a CPU and a GPU tensor mixed) are skipped by design.
gpu = (builds["backend"] != "cpu").any()
judged = checks if gpu else checks[~((checks["kind"] == "bad_input") & (checks["status"] == "skipped"))]
enforce_strict(judged, snakemake.params.strict, "extension_build (correctness and bad-input checks)")
