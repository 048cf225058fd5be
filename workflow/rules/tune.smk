# Opt-in tuning sweeps (docs/guide/configuration.md): run by name, `snakemake --cores 1 tune_triton` or
# `tune_fast`. Nothing registers their outputs, so neither `all` nor the report waits for them.


localrules:
    tune_triton,
    tune_fast,
    tune_triton_table,


rule tune_triton:
    input:
        expand(result("tune/triton.csv"), target=TARGETS),


rule tune_fast:
    input:
        expand(result("tune/fast.csv"), target=TARGETS),


# One job per op: each fits a device call of its own; an edit of one op's kernel reruns its job, one of
# kernels/triton/config.py all of them (every op's candidates come from it).
rule tune_triton_op:
    input:
        env=result("env/env.json"),
        ceilings=result(CEILINGS.path),
    output:
        result("tune/triton/{op}.csv"),
    log:
        log_of("tune_triton_op_{op}"),
    benchmark:
        benchmark_of("tune_triton_op_{op}")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("tune_triton_op"),
        # Also this op's Triton kernel files (its kernel module in the op registry, and what that imports).
        code=lambda w: code(
            "tune_triton_op.py", *kernel_sources("triton", w.op, CHECKOUT)
        ),
        target_env=target_env,
        # The bench cells' sizes and dtypes of this op, as bench_cell gets them.
        sizes=lambda w: (
            BENCH_SIZES if BENCH_SIZES == "auto" else BENCH_SIZES.get(w.op, "auto")
        ),
        bench={
            k: config["bench"][k] for k in ("dtypes", "max_tensor_mib", "tolerances")
        },
        timing=config["timing"],
    script:
        "../scripts/tune_triton_op.py"


rule tune_triton_table:
    input:
        ops=lambda w: expand(
            result("tune/triton/{op}.csv"), target=w.target, op=BENCH_OPS
        ),
    output:
        result("tune/triton.csv"),
    log:
        log_of("tune_triton_table"),
    benchmark:
        benchmark_of("tune_triton_table")
    params:
        put_back=put_back("tune_triton_table"),
        code=code("tune_triton_table.py"),
    script:
        "../scripts/tune_triton_table.py"


rule tune_fast_run:
    input:
        models=lambda w: expand(
            result("llm/models/{model}.json"),
            target=w.target,
            model=sorted(LLM_MODELS),
        ),
        env=result("env/env.json"),
        ceilings=result(CEILINGS.path),
    output:
        result("tune/fast.csv"),
    log:
        log_of("tune_fast_run"),
    benchmark:
        benchmark_of("tune_fast_run")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("tune_fast_run"),
        code=code("tune_fast_run.py"),
        target_env=target_env,
        llm=LLM_MEASURE,
    script:
        "../scripts/tune_fast_run.py"
