rule report_render:
    input:
        step_outputs(),
    output:
        config["report"]["output"],
    log:
        f"{RESULTS}/report_render.log",
    params:
        results_dir=RESULTS,
        config=config,
    script:
        "../scripts/report_render.py"
