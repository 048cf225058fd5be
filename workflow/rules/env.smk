rule env_capture:
    input:
        src=sources("env_capture.py"),
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
        strict=config["strict"],
        timeout_s=config["env_capture"]["tool_timeout_s"],
    script:
        "../scripts/env_capture.py"


register_outputs("env", expand(result("env/env.json"), target=TARGETS))
