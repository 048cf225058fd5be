from gpulab.llm.models import download_settings, models_by_slug, needs_tiny

# LLM inference: each configured model is resolved once per target (downloads run on the submitting host),
# then every engine measures it in its own job. Model names become file names through model_slug.
LLM = config["llm"]
LLM_MODELS = models_by_slug(LLM["models"])
# Settings that change measurements; the model list, engines and download settings do not rerun other jobs.
LLM_MEASURE = {
    k: v
    for k, v in LLM.items()
    if k not in ("models", "engines", "cache_dir", "local_paths", "revisions")
}


wildcard_constraints:
    model="|".join(sorted(LLM_MODELS)),
    engine="hf|fast|fast_exact",


localrules:
    llm_tiny_build,
    llm_model_fetch,


rule llm_tiny_build:
    input:
        src=sources("llm_tiny_build.py"),
    output:
        directory(result("llm/models/tiny")),
    log:
        log_of("llm_tiny_build"),
    benchmark:
        benchmark_of("llm_tiny_build")
    conda:
        CONDA_ENV
    params:
        seed=LLM["seed"],
    script:
        "../scripts/llm_tiny_build.py"


rule llm_model_fetch:
    input:
        src=sources("llm_model_fetch.py"),
        tiny=lambda w: (
            f"{RESULTS}/{w.target}/llm/models/tiny"
            if needs_tiny(LLM_MODELS[w.model])
            else []
        ),
    output:
        result("llm/models/{model}.json"),
    log:
        log_of("llm_model_fetch_{model}"),
    benchmark:
        benchmark_of("llm_model_fetch_{model}")
    conda:
        CONDA_ENV
    params:
        spec=lambda w: LLM_MODELS[w.model],
        llm=lambda w: download_settings(LLM_MODELS[w.model], LLM),
    script:
        "../scripts/llm_model_fetch.py"


rule llm_infer:
    input:
        src=sources("llm_infer.py"),
        model=result("llm/models/{model}.json"),
        env=result("env/env.json"),
        ceilings=result("bench/ceilings.csv"),
    output:
        csv=report(
            result("llm/{model}__{engine}.csv"),
            caption="../report/llm.rst",
            category="LLM inference",
        ),
        text=result("llm/{model}__{engine}.json"),
        kernels=result("llm/kernels/{model}__{engine}.csv"),
    log:
        log_of("llm_infer_{model}__{engine}"),
    benchmark:
        benchmark_of("llm_infer_{model}__{engine}")
    conda:
        CONDA_ENV
    threads: DEVICE_THREADS
    resources:
        **gpu_resources,
    params:
        llm=LLM_MEASURE,
        strict=config["strict"],
    script:
        "../scripts/llm_infer.py"


register_outputs(
    "llm",
    expand(
        result("llm/{kernels}{model}__{engine}.csv"),
        target=TARGETS,
        kernels=["", "kernels/"],
        model=sorted(LLM_MODELS),
        engine=LLM["engines"],
    ),
)
