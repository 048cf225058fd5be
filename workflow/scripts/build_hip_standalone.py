"""Snakemake script of rule hip_standalone: thin wrapper over gpulab.native.hip_standalone."""

from pathlib import Path

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.native.hip_standalone import HIP_STANDALONE, run_standalone

    run_standalone(
        target=step.target, fingerprint=step.fingerprint,
        build_config={"offload_archs": step.params.offload_archs, "extra_cflags": step.params.extra_cflags,
                      "standalone_sizes": step.params.sizes},
        timing=step.timing(), out_csv=Path(step.output.csv), build_log=Path(step.output.build_log),
        run_log=Path(step.output.run_log),
    )
    table = HIP_STANDALONE.read(step.output.csv)
    step.show(table, ["phase", "status", "compiler", "arch", "build_s", "size", "correct", "kernel_ms", "gbps",
                      "reason"])
    build = table[table["phase"] == "build"]
    if (build["status"] == "failed").any():
        # Our own source failed to compile: that is a broken step, whatever `strict` says.
        print(Path(step.output.build_log).read_text(encoding="utf-8"))
        raise SystemExit(f"hip_standalone: {build['reason'].iloc[0]}")


run(snakemake, main)
