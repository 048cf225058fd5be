"""Snakemake script of rule tune_fast_run: engine fast's decode step under each variant (gpulab.llm.tune)."""

from gpulab.workflow.step import Step, run


def main(step: Step) -> None:
    from gpulab.llm.probe import apply_aotriton_env

    # Before PyTorch starts, as in llm_infer: the study's AOTriton switch.
    apply_aotriton_env(step.params.llm["aotriton_experimental"])
    from gpulab.llm.tune import tune_fast_job

    table = tune_fast_job(step.input.models, step.params.llm, target=step.target, fingerprint=step.fingerprint,
                          ceilings_path=step.input.ceilings, out_path=step.output[0])
    step.show(table, ["model", "variant", "default", "status", "tok_s", "pct_of_ceiling", "tokens_match_default",
                      "prepare_s", "reason"])


run(snakemake, main)
