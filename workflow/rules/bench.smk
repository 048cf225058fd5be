from gpulab.bench.impls import needs_extension
from gpulab.core.ceilings import CEILINGS

BENCH_OPS = config["bench"]["ops"]
BENCH_IMPLS = config["bench"]["impls"]
BENCH_SIZES = config["bench"]["sizes"]


wildcard_constraints:
    op="|".join(BENCH_OPS),
    impl="|".join(BENCH_IMPLS),


rule bench_ceilings:
    input:
        env=result("env/env.json"),
    output:
        report(
            result(CEILINGS.path),
            caption="../report/ceilings.rst",
            category="Benchmarks",
        ),
    log:
        log_of("bench_ceilings"),
    benchmark:
        benchmark_of("bench_ceilings")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("bench_ceilings"),
        code=code("bench_ceilings.py"),
        target_env=target_env,
        ceilings=config["ceilings"],
        # The matrix's sizes: the ceilings are measured at each tensor size a cell uses.
        bench={
            k: config["bench"][k] for k in ("ops", "sizes", "dtypes", "max_tensor_mib")
        },
        timing=config["timing"],
    script:
        "../scripts/bench_ceilings.py"


rule bench_cell:
    input:
        env=result("env/env.json"),
        ceilings=result(CEILINGS.path),
        # cpp_ext cells load exactly the library the build step's manifest names.
        extension=lambda w: (
            [EXTENSION_MANIFEST.format(target=w.target)]
            if needs_extension(w.impl)
            else []
        ),
    output:
        result("bench/cells/{op}__{impl}.csv"),
    log:
        log_of("bench_cell_{op}__{impl}"),
    benchmark:
        benchmark_of("bench_cell_{op}__{impl}")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("bench_cell"),
        # Also the kernel files of this cell's implementation only: editing one op's kernel reruns that cell.
        code=cell_code,
        target_env=target_env,
        # Only this cell's settings: editing another op's sizes does not rerun this job.
        sizes=lambda w: (
            BENCH_SIZES if BENCH_SIZES == "auto" else BENCH_SIZES.get(w.op, "auto")
        ),
        bench={
            k: config["bench"][k] for k in ("dtypes", "max_tensor_mib", "tolerances")
        },
        timing=config["timing"],
    script:
        "../scripts/bench_cell.py"


rule bench_aggregate:
    input:
        # Every op's cells: each table's rows share one ceiling per pattern, dtype and size.
        cells=lambda w: expand(
            result("bench/cells/{op}__{impl}.csv"),
            target=w.target,
            op=BENCH_OPS,
            impl=BENCH_IMPLS,
        ),
    output:
        report(
            result("bench/{op}.csv"),
            caption="../report/bench.rst",
            category="Benchmarks",
        ),
    log:
        log_of("bench_aggregate_{op}"),
    benchmark:
        benchmark_of("bench_aggregate_{op}")
    params:
        put_back=put_back("bench_aggregate"),
        code=code("bench_aggregate.py"),
    script:
        "../scripts/bench_aggregate.py"


localrules:
    bench_aggregate,


register_outputs(
    "bench",
    expand(result(CEILINGS.path), target=TARGETS)
    + expand(result("bench/{op}.csv"), target=TARGETS, op=BENCH_OPS),
)


register_outcomes("bench_ceilings", expand(result(CEILINGS.path), target=TARGETS))
register_outcomes(
    "bench_cell", expand(result("bench/{op}.csv"), target=TARGETS, op=BENCH_OPS)
)
