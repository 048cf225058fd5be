"""Snakemake script of rule bench_ceilings: thin wrapper over gpulab.ceilings."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

apply_target_env(snakemake.config, snakemake.wildcards.target)

from gpulab.bench.sizes import max_tensor_bytes  # noqa: E402
from gpulab.build import load_from_manifest  # noqa: E402
from gpulab.ceilings import CEILINGS, measure_ceilings  # noqa: E402
from gpulab.device import detect  # noqa: E402
from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.mlp.model import gemm_shapes, resolve_shape  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402
from gpulab.timing import TimingSettings  # noqa: E402

load_from_manifest(snakemake.input.extension)
info = detect()
rows = measure_ceilings(
    snakemake.params.ceilings,
    TimingSettings.from_config(snakemake.params.timing),
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    # Up to at least the largest tensor the benchmark matrix uses.
    max_tensor_bytes=max_tensor_bytes(info, snakemake.params.max_tensor_mib),
    # The MLP's own GEMM shapes join the matmul ceiling's squares.
    gemms=gemm_shapes(resolve_shape(snakemake.params.mlp, info)),
    device=info,
)
table = CEILINGS.write(rows, snakemake.output[0])
columns = ["kind", "dtype", "size", "method", "best", "status", "gbps", "tflops", "median_ms", "reps", "stable"]
print(table[columns].to_string(index=False))
# Without a GPU, Triton and the extension are skipped by design: strict judges the methods that can run.
judged = table if info.gpu_available else table[table["status"] != "skipped"]
enforce_strict(judged, snakemake.params.strict, "bench_ceilings")
