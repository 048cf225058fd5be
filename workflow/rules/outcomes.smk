# Every not-ok outcome, on every run (gpulab.workflow.outcomes): measuring steps record every outcome and never
# fail for one; this local step reads every step's recorded table into one. Strict mode judges, it never
# re-measures: with `strict` on, `all` also asks for the judgement, which fails with one summary of every outcome
# that is not ok, so turning strict on or off after a complete run runs it (and the report, whose params hold the
# config) and no measurement; a failed judgement leaves the recorded table in place.
OUTCOMES = f"{RESULTS}/outcomes.csv"
STRICT_VERDICT = f"{RESULTS}/strict.txt"


rule outcomes_record:
    input:
        tables=[path for paths in OUTCOME_TABLES.values() for path in paths],
        envs=expand(result("env/env.json"), target=TARGETS),
    output:
        OUTCOMES,
    log:
        f"{RESULTS}/outcomes_record.log",
    benchmark:
        f"{RESULTS}/benchmarks/outcomes_record.jsonl"
    params:
        code=code("outcomes_record.py"),
        tables=OUTCOME_TABLES,
        results_dir=lambda wildcards: RESULTS,
        # `strict: unstable` also records the ok rows measured with an unstable timing.
        unstable=config["strict"] == "unstable",
    script:
        "../scripts/outcomes_record.py"


rule outcomes_check:
    input:
        OUTCOMES,
    output:
        STRICT_VERDICT,
    log:
        f"{RESULTS}/outcomes_check.log",
    benchmark:
        f"{RESULTS}/benchmarks/outcomes_check.jsonl"
    params:
        code=code("outcomes_check.py"),
        strict=config["strict"],
    script:
        "../scripts/outcomes_check.py"


localrules:
    outcomes_record,
    outcomes_check,
