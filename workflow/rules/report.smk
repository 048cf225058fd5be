from gpulab.report.results import foreign_files
from gpulab.workflow import pages


rule report_render:
    input:
        steps=step_outputs(),
        # Targets copied in from other machines: a new or changed one renders the report again.
        foreign=foreign_files(RESULTS, TARGETS),
    output:
        report(
            config["report"]["output"],
            caption="../report/report.rst",
            category="Report",
        ),
    log:
        f"{RESULTS}/report_render.log",
    benchmark:
        f"{RESULTS}/benchmarks/report_render.jsonl"
    # Its sections render at once, a worker process a core (the last job of a local run: nothing else runs then).
    threads: workflow.cores if LOCAL_RUN else 1
    params:
        code=code("report_render.py"),
        # Changes when a failed render's page was put back (gpulab.workflow.pages): the next run renders it again.
        put_back=lambda wildcards: pages.stamp(config["report"]["output"]),
        results_dir=lambda wildcards: RESULTS,
        config=config,
        # Each rule's output patterns: with the jobs' benchmark records (wildcards, inputs) they give the
        # dependencies the methodology section's critical path follows.
        rule_outputs=lambda wildcards: {
            r.name: [str(f) for f in r.output] for r in workflow.rules
        },
    script:
        "../scripts/report_render.py"
