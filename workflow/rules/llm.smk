from gpulab.workflow.cluster import without_gpu_where
from gpulab.llm.models import download_settings, models_by_slug, needs_tiny, runs_on_cpu

# LLM inference: each configured model is resolved once per target (downloads run on the submitting host),
# then one job measures it with every engine. Model names become file names through model_slug.
LLM = config["llm"]
LLM_MODELS = models_by_slug(LLM["models"])
# Settings that change measurements; the model list, engines and download settings do not rerun other jobs.
LLM_MEASURE = {
    k: v
    for k, v in LLM.items()
    if k
    not in ("models", "engines", "cache_dir", "local_paths", "revisions", "tiny_device")
}
# Models measured on the host CPU beside the device jobs (llm.tiny_device): no device, no device ceiling.
LLM_ON_CPU = {
    slug
    for slug, spec in LLM_MODELS.items()
    if runs_on_cpu(
        spec, LLM["models"], LLM["tiny_device"], LOCAL_RUN and gpu_driver_present()
    )
}
# What one model's job writes: these files for every configured engine.
LLM_ENGINE_OUTPUTS = {
    name: expand(result(path), engine=LLM["engines"], allow_missing=True)
    for name, path in {
        "csv": "llm/{model}__{engine}.csv",
        "text": "llm/{model}__{engine}.json",
        "kernels": "llm/kernels/{model}__{engine}.csv",
    }.items()
}
# Only a local run has a core count (and only there does a model leave the device).
LLM_CPU_THREADS = min(4, workflow.cores) if LLM_ON_CPU else 1


wildcard_constraints:
    model="|".join(sorted(LLM_MODELS)),


localrules:
    llm_tiny_build,
    llm_model_fetch,


rule llm_tiny_build:
    output:
        directory(result("llm/models/tiny")),
    log:
        log_of("llm_tiny_build"),
    benchmark:
        benchmark_of("llm_tiny_build")
    params:
        put_back=put_back("llm_tiny_build"),
        code=code("llm_tiny_build.py"),
        seed=LLM["seed"],
    script:
        "../scripts/llm_tiny_build.py"


rule llm_model_fetch:
    input:
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
    params:
        put_back=put_back("llm_model_fetch"),
        code=code("llm_model_fetch.py"),
        spec=lambda w: LLM_MODELS[w.model],
        llm=lambda w: download_settings(LLM_MODELS[w.model], LLM),
    script:
        "../scripts/llm_model_fetch.py"


rule llm_infer:
    input:
        model=result("llm/models/{model}.json"),
        env=result("env/env.json"),
        ceilings=lambda w: (
            [] if w.model in LLM_ON_CPU else f"{RESULTS}/{w.target}/{CEILINGS.path}"
        ),
    output:
        csv=[
            report(p, caption="../report/llm.rst", category="LLM inference")
            for p in LLM_ENGINE_OUTPUTS["csv"]
        ],
        text=LLM_ENGINE_OUTPUTS["text"],
        kernels=LLM_ENGINE_OUTPUTS["kernels"],
    log:
        log_of("llm_infer_{model}"),
    benchmark:
        benchmark_of("llm_infer_{model}")
    threads: lambda w: LLM_CPU_THREADS if w.model in LLM_ON_CPU else DEVICE_THREADS
    resources:
        **without_gpu_where(gpu_resources, lambda w: w.model in LLM_ON_CPU),
    params:
        put_back=put_back("llm_infer"),
        code=code("llm_infer.py"),
        target_env=target_env,
        engines=LLM["engines"],
        on_cpu=lambda w: w.model in LLM_ON_CPU,
        llm=LLM_MEASURE,
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


register_outcomes(
    "llm_infer",
    expand(
        result("llm/{model}__{engine}.csv"),
        target=TARGETS,
        model=sorted(LLM_MODELS),
        engine=LLM["engines"],
    ),
)
