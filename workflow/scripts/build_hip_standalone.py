"""Snakemake script of rule hip_standalone: thin wrapper over gpulab.hip_standalone."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from pathlib import Path  # noqa: E402

from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.hip_standalone import HIP_STANDALONE, run_standalone  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402
from gpulab.timing import TimingSettings  # noqa: E402

run_standalone(
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    build_config={
        "offload_archs": snakemake.params.offload_archs,
        "extra_cflags": snakemake.params.extra_cflags,
        "standalone_sizes": snakemake.params.sizes,
    },
    timing=TimingSettings.from_config(snakemake.params.timing),
    out_csv=Path(snakemake.output.csv),
    build_log=Path(snakemake.output.build_log),
    run_log=Path(snakemake.output.run_log),
)
table = HIP_STANDALONE.read(snakemake.output.csv)
print(table[["phase", "status", "compiler", "arch", "build_s", "size", "correct", "kernel_ms", "gbps", "reason"]]
      .to_string(index=False))
build = table[table["phase"] == "build"]
if (build["status"] == "failed").any():
    # Our own source failed to compile: that is a broken step, whatever `strict` says.
    print(Path(snakemake.output.build_log).read_text(encoding="utf-8"))
    raise SystemExit(f"hip_standalone: {build['reason'].iloc[0]}")
enforce_strict(table, snakemake.params.strict, "hip_standalone")
