"""Snakemake script of rule bench_ceilings: thin wrapper over gpulab.core.ceilings."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.bench.sizes import matrix_tensor_bytes
    from gpulab.core.ceilings import CEILINGS, measure_ceilings
    from gpulab.core.device import detect, max_tensor_bytes

    info = detect()
    bench = step.params.bench
    rows = measure_ceilings(
        step.params.ceilings, step.timing(), target=step.target, fingerprint=step.fingerprint,
        # At exactly the tensor sizes the benchmark cells resolve, so each row finds its own.
        matrix=matrix_tensor_bytes(bench["ops"], bench["sizes"], bench["dtypes"], info, bench["max_tensor_mib"]),
        max_tensor_bytes=max_tensor_bytes(info, bench["max_tensor_mib"]),
        device=info,
    )
    table = CEILINGS.write(rows, step.output[0])
    step.show(table, ["kind", "dtype", "size", "method", "best", "status", "gbps", "tflops", "median_ms", "reps",
                      "stable"])


run(snakemake, main)
