from gpulab.toolchains.archs import ARCHS
from gpulab.toolchains.hipcc import hip_inputs

# Every source a compile depends on is in its `code` digest (the Triton kernels through gpulab.workflow.sources; the HIP
# sources and the headers they include through `hip_inputs`): editing a kernel reruns the architectures' jobs,
# and the cache of compiled outcomes, keyed by source, recompiles just what changed.
HIP_INPUTS = [os.path.relpath(p, CHECKOUT) for p in hip_inputs()]


wildcard_constraints:
    arch="|".join(ARCHS),


rule kernels_compile:
    input:
        env=result("env/env.json"),
    output:
        result("build/kernels/{arch}.csv"),
    log:
        log_of("kernels_compile_{arch}"),
    benchmark:
        benchmark_of("kernels_compile_{arch}")
    params:
        put_back=put_back("kernels_compile"),
        code=code("kernels_compile.py", *HIP_INPUTS),
        dtypes=config["bench"]["dtypes"],
        sizes=config["bench"]["sizes"],
    script:
        "../scripts/kernels_compile.py"


rule kernels_aggregate:
    input:
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
    params:
        put_back=put_back("kernels_aggregate"),
        code=code("kernels_aggregate.py"),
    script:
        "../scripts/kernels_aggregate.py"


# Static compilation measures nothing on the device: on a cluster it runs on the submitting host.
localrules:
    kernels_compile,
    kernels_aggregate,


register_outputs(
    "kernels", expand(result("build/kernel_resources.csv"), target=TARGETS)
)


register_outcomes(
    "kernels_compile", expand(result("build/kernel_resources.csv"), target=TARGETS)
)
