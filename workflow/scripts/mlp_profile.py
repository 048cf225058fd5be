"""Snakemake script of rule mlp_profile: thin wrapper over gpulab.mlp.profile."""

from pathlib import Path

from gpulab.workflow.step import Step, run, start_inductor


def main(step: Step) -> None:
    import pandas as pd

    from gpulab.core.ceilings import Ceilings
    from gpulab.core.device import detect
    from gpulab.mlp.ceilings import MLP_CEILINGS, measure_gemm_ceilings
    from gpulab.mlp.model import ceiling_dtypes, gemm_shapes, resolve_shape
    from gpulab.mlp.profile import profile_mlp

    start_inductor()  # the compiled variants

    info, mlp = detect(), step.params.mlp
    # The matmul ceiling at the MLP's own GEMM shapes, measured here: the MLP's settings never re-measure
    # the benchmark matrix's ceilings (and so every benchmark cell placed against it).
    shape = resolve_shape(mlp, info)
    # ... and on the MLP's own path: its Linear layers forward and backward in each variant's precision.
    gemms = measure_gemm_ceilings(ceiling_dtypes(mlp["variants"]), gemm_shapes(shape), step.timing(),
                                  target=step.target, fingerprint=step.fingerprint, mlp=shape,
                                  device=info)
    own = MLP_CEILINGS.write(gemms, step.output.ceilings)
    summary = profile_mlp(
        mlp, step.timing(), target=step.target, fingerprint=step.fingerprint, device=info,
        ceilings=Ceilings(pd.concat([Ceilings.load(step.input.ceilings).table, own], ignore_index=True)),
        out_dir=Path(step.output.summary).parent,
    )
    step.show(summary, ["variant", "status", "reason", "median_ms", "tflops", "pct_of_ceiling"])


run(snakemake, main)
