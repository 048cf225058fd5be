# Kernel sources and library code are in each step's `code` digest (common.smk), so editing one reruns its step
# (and, through the cache key, rebuilds).
# The built extension travels through the DAG as this manifest (library path, digest, arch, outcome).
EXTENSION_MANIFEST = result("build/extension_manifest.json")


rule hip_standalone:
    input:
        env=result("env/env.json"),
    output:
        csv=report(
            result("build/hip_standalone.csv"),
            caption="../report/build.rst",
            category="Build",
        ),
        build_log=result("build/hip_standalone_build.log"),
        run_log=result("build/hip_standalone_run.log"),
    log:
        log_of("hip_standalone"),
    benchmark:
        benchmark_of("hip_standalone")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("hip_standalone"),
        code=code("build_hip_standalone.py"),
        target_env=target_env,
        offload_archs=config["build"]["offload_archs"],
        extra_cflags=config["build"]["extra_cflags"],
        sizes=config["build"]["standalone_sizes"],
        timing=config["timing"],
    script:
        "../scripts/build_hip_standalone.py"


rule extension_build:
    input:
        env=result("env/env.json"),
    output:
        csv=report(
            result("build/extension.csv"),
            caption="../report/build.rst",
            category="Build",
        ),
        checks=result("build/extension_checks.csv"),
        build_log=result("build/extension_build.log"),
        manifest=EXTENSION_MANIFEST,
    log:
        log_of("extension_build"),
    benchmark:
        benchmark_of("extension_build")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("extension_build"),
        code=code("build_extension.py"),
        target_env=target_env,
        offload_archs=config["build"]["offload_archs"],
        extra_cflags=config["build"]["extra_cflags"],
    script:
        "../scripts/build_extension.py"


rule timing_pitfalls:
    input:
        manifest=EXTENSION_MANIFEST,
        env=result("env/env.json"),
    output:
        result("build/timing_pitfalls.csv"),
    log:
        log_of("timing_pitfalls"),
    benchmark:
        benchmark_of("timing_pitfalls")
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        put_back=put_back("timing_pitfalls"),
        code=code("build_timing_pitfalls.py"),
        target_env=target_env,
        timing=config["timing"],
    script:
        "../scripts/build_timing_pitfalls.py"


register_outputs(
    "build",
    expand(
        result("build/{name}.csv"),
        target=TARGETS,
        name=["hip_standalone", "extension", "extension_checks", "timing_pitfalls"],
    ),
)


register_outcomes(
    "hip_standalone", expand(result("build/hip_standalone.csv"), target=TARGETS)
)
register_outcomes(
    "extension_build",
    expand(
        result("build/{name}.csv"),
        target=TARGETS,
        name=["extension", "extension_checks"],
    ),
)
register_outcomes(
    "timing_pitfalls", expand(result("build/timing_pitfalls.csv"), target=TARGETS)
)
