# Strict mode judges, it never re-measures (gpulab.workflow.outcomes): measuring steps record every outcome and never fail
# for one; this local step reads every step's recorded table and, with `strict` on, fails with one summary of every
# outcome that is not ok. `all` asks for it only when strict is on, so turning strict on or off after a complete run
# runs this judgement (and the report, whose params hold the config) and no measurement.
OUTCOMES = f"{RESULTS}/outcomes.csv"


rule outcomes_check:
    input:
        tables=[path for paths in OUTCOME_TABLES.values() for path in paths],
        envs=expand(result("env/env.json"), target=TARGETS),
    output:
        OUTCOMES,
    log:
        f"{RESULTS}/outcomes_check.log",
    benchmark:
        f"{RESULTS}/benchmarks/outcomes_check.jsonl"
    params:
        code=code("outcomes_check.py"),
        tables=OUTCOME_TABLES,
        results_dir=lambda wildcards: RESULTS,
        strict=config["strict"],
    script:
        "../scripts/outcomes_check.py"


localrules:
    outcomes_check,
