rule report_render:
    input:
        step_outputs(),
    output:
        report(
            config["report"]["output"],
            caption="../report/report.rst",
            category="Report",
        ),
    log:
        f"{RESULTS}/report_render.log",
    conda:
        CONDA_ENV
    params:
        results_dir=lambda wildcards: RESULTS,
        config=config,
    script:
        "../scripts/report_render.py"
