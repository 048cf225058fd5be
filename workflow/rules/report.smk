rule report_render:
    input:
        step_outputs(),
    output:
        config["report"]["output"],
    log:
        f"{RESULTS}/report_render.log",
    conda:
        CONDA_ENV
    params:
        results_dir=lambda wildcards: RESULTS,
        config=config,
    script:
        "../scripts/report_render.py"
