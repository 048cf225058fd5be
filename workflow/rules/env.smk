from gpulab.core.cores import confine_job, plan as plan_measuring_cores

# A job measuring on the device keeps CPUs of its own (gpulab.core.cores): only where jobs run beside each other on one
# host with a GPU (DEVICE_LOCK, common.smk). The jobs of the run inherit the choice, and start off those CPUs as
# Snakemake itself stays off them.
if workflow.is_main_process:
    plan_measuring_cores(
        config["measure_cores"], enabled=DEVICE_LOCK and workflow.cores > 1
    )
    confine_job()


rule env_capture:
    output:
        env=result("env/env.json"),
        tools=result("env/tools.csv"),
        stack=report(
            result("env/runtime_stack.csv"),
            caption="../report/runtime_stack.rst",
            category="Environment",
        ),
    log:
        log_of("env_capture"),
    benchmark:
        benchmark_of("env_capture")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("env_capture"),
        code=code("env_capture.py"),
        target_env=target_env,
        timeout_s=config["env_capture"]["tool_timeout_s"],
    script:
        "../scripts/env_capture.py"


register_outputs("env", expand(result("env/env.json"), target=TARGETS))


register_outcomes(
    "env_capture",
    expand(result("env/{name}.csv"), target=TARGETS, name=["tools", "runtime_stack"]),
)
