from gpulab.kernel_compile.archs import ARCHS
from gpulab.kernel_compile.hipcc import hip_inputs

# Every source a compile depends on is an input (`sources`: the Triton kernels; `hip_inputs`: the HIP
# sources and the headers they include): editing a kernel reruns the architectures' jobs, and the cache of
# compiled outcomes, keyed by source, recompiles just what changed.


wildcard_constraints:
    arch="|".join(ARCHS),


rule kernels_compile:
    input:
        src=sources("kernels_compile.py") + _from_workdir(hip_inputs()),
        env=result("env/env.json"),
    output:
        result("build/kernels/{arch}.csv"),
    log:
        log_of("kernels_compile_{arch}"),
    benchmark:
        benchmark_of("kernels_compile_{arch}")
    params:
        dtypes=config["bench"]["dtypes"],
        sizes=config["bench"]["sizes"],
        strict=config["strict"],
    script:
        "../scripts/kernels_compile.py"


rule kernels_aggregate:
    input:
        src=sources("kernels_aggregate.py"),
        cells=expand(result("build/kernels/{arch}.csv"), arch=ARCHS, allow_missing=True),
    output:
        report(
            result("build/kernel_resources.csv"),
            caption="../report/kernels.rst",
            category="Build",
        ),
    log:
        log_of("kernels_aggregate"),
    benchmark:
        benchmark_of("kernels_aggregate")
    script:
        "../scripts/kernels_aggregate.py"


# Static compilation measures nothing on the device: on a cluster it runs on the submitting host.
localrules:
    kernels_compile,
    kernels_aggregate,


register_outputs(
    "kernels", expand(result("build/kernel_resources.csv"), target=TARGETS)
)
