# One trace and one stacks file per configured variant (a skipped variant's files say why).
MLP_TRACES = expand(
    result("mlp/trace_{variant}.json.gz"),
    variant=config["mlp"]["variants"],
    allow_missing=True,
)
MLP_STACKS = expand(
    result("mlp/stacks_{variant}.txt"),
    variant=config["mlp"]["variants"],
    allow_missing=True,
)


rule mlp_profile:
    input:
        env=result("env/env.json"),
        ceilings=result(CEILINGS.path),
    output:
        summary=report(
            result("mlp/summary.csv"),
            caption="../report/mlp.rst",
            category="MLP profile",
        ),
        # The matmul ceiling at the MLP's own GEMM shapes (the variants' dtypes), beside the benchmark matrix's.
        ceilings=result("mlp/ceilings.csv"),
        kernels=result("mlp/kernels.csv"),
        ops=result("mlp/ops.csv"),
        traces=MLP_TRACES,
        stacks=MLP_STACKS,
    log:
        log_of("mlp_profile"),
    benchmark:
        benchmark_of("mlp_profile")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("mlp_profile"),
        code=code("mlp_profile.py"),
        target_env=target_env,
        mlp=config["mlp"],
        timing=config["timing"],
    script:
        "../scripts/mlp_profile.py"


register_outputs("mlp", expand(result("mlp/summary.csv"), target=TARGETS))


register_outcomes(
    "mlp_profile",
    expand(result("mlp/{name}.csv"), target=TARGETS, name=["summary", "ceilings"]),
)
