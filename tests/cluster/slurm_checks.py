"""Checks of .ci/slurm.sh against the live CI cluster: exit status 1 and the reason when one fails.

    slurm_checks.py probe TARGETS_YAML RESULTS_DIR      # jobs of each target: partition, GPU model, env
    slurm_checks.py jobs SNAKEMAKE_OUTPUT               # every cluster job ran and completed in Slurm
    slurm_checks.py schema REFERENCE_DIR SLURM_DIR      # same CSV files and columns as a local run

Slurm's own view of a job comes from `scontrol show job` (the CI cluster keeps finished jobs for an
hour), never from Snakemake's word alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import yaml

# "Job 3 has been submitted with SLURM jobid 17 (log: /.../17.log)."
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?$")
# Snakemake announces each job as "rule NAME:" (cluster) or "localrule NAME:" (this host), then its jobid.
ANNOUNCED = re.compile(r"^(localrule|rule) (\w+):\n(?:    .*\n)*?    jobid: (\d+)$", re.MULTILINE)


class CheckFailed(AssertionError):
    pass


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def slurm_job(job_id: str) -> dict[str, str]:
    """`scontrol show job` of one job as a mapping of its Key=Value fields."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    require(proc.returncode == 0, f"Slurm has no record of job {job_id}: {proc.stderr.strip()}")
    return dict(re.findall(r"(\S+?)=(\S*)", proc.stdout))


def check_probe(targets_yaml: Path, results: Path) -> None:
    targets = yaml.safe_load(targets_yaml.read_text())["targets"]
    for name, spec in sorted(targets.items()):
        probe_path = results / name / "probe.json"
        require(probe_path.exists(), f"{name}: no {probe_path} (its job did not run)")
        probe = json.loads(probe_path.read_text())
        job_id = probe["slurm"].get("SLURM_JOB_ID")
        require(bool(job_id), f"{name}: the job saw no SLURM_JOB_ID, so it did not run under Slurm")
        job = slurm_job(job_id)
        require(job.get("JobState") == "COMPLETED", f"{name}: Slurm job {job_id} is {job.get('JobState')}")
        require(job.get("Partition") == spec["partition"] == probe["slurm"].get("SLURM_JOB_PARTITION"),
                f"{name}: job {job_id} ran on partition {job.get('Partition')}, not {spec['partition']}")
        gpus = spec.get("gpus", 1)
        wanted = f"gres:gpu:{spec['gpu_model']}:{gpus}"
        require(job.get("TresPerJob") == wanted,
                f"{name}: job {job_id} asked Slurm for {job.get('TresPerJob')!r}, not {wanted!r}")
        require(probe["slurm"].get("SLURM_GPUS_ON_NODE") == str(gpus),
                f"{name}: job {job_id} was given {probe['slurm'].get('SLURM_GPUS_ON_NODE')} GPUs, not {gpus}")
        for var, value in spec.get("env", {}).items():
            require(probe["environ"].get(var) == value,
                    f"{name}: {var}={probe['environ'].get(var)!r} in the job, configured {value!r}")
        require(probe["environ"].get("GPULAB_CI_INHERITED") == "from-submit-host",
                f"{name}: the submitting shell's environment did not reach the job")
        own = spec.get("env", {})
        leaked = sorted(var for other, other_spec in targets.items() if other != name
                        for var, value in other_spec.get("env", {}).items()
                        if var not in own and probe["environ"].get(var) == value)
        require(not leaked, f"{name}: another target's variables reached this job: {leaked}")
        print(f"ok  {name}: Slurm job {job_id} on partition {job['Partition']}, {job['TresPerJob']}, "
              f"env {spec.get('env', {})}")


def check_jobs(snakemake_output: Path) -> None:
    text = snakemake_output.read_text(errors="replace")
    announced = {int(jobid): (kind, rule) for kind, rule, jobid in ANNOUNCED.findall(text)}
    submitted = {int(m[1]): (m[2], Path(m[3])) for m in map(SUBMITTED.search, text.splitlines()) if m}
    require(bool(submitted), "no job was submitted to Slurm")
    cluster_jobs = {jobid for jobid, (kind, _) in announced.items() if kind == "rule"}
    local_jobs = {jobid for jobid, (kind, _) in announced.items() if kind == "localrule"}
    require(cluster_jobs == set(submitted),
            f"cluster jobs {sorted(cluster_jobs)} but Slurm submissions for {sorted(submitted)}")
    require(not local_jobs & set(submitted), "a local rule was submitted to Slurm")
    for jobid, (slurm_id, log) in sorted(submitted.items()):
        rule = announced[jobid][1]
        job = slurm_job(slurm_id)
        require(job.get("JobState") == "COMPLETED", f"{rule}: Slurm job {slurm_id} is {job.get('JobState')}")
        require(job.get("TresPerJob", "").startswith("gres:gpu:"),
                f"{rule}: Slurm job {slurm_id} asked for no GPU ({job.get('TresPerJob')!r})")
        require(log.exists(), f"{rule}: the Slurm log {log} of job {slurm_id} is missing")
    rules = sorted({announced[j][1] for j in submitted})
    local_rules = sorted({announced[j][1] for j in local_jobs})
    print(f"ok  {len(submitted)} Slurm jobs COMPLETED with a GPU, rules {', '.join(rules)}; "
          f"on this host: {', '.join(local_rules)}")


def _named(rel: Path) -> str:
    """A table's path, with the kept run's name (``history/<time>__<commit>__<digest>/``) as ``history/<run>/``:
    each run names its own."""
    parts = rel.parts
    return str(Path("history", "<run>", *parts[2:])) if len(parts) > 2 and parts[0] == "history" else str(rel)


def csv_columns(root: Path) -> dict[str, list[str]]:
    return {_named(p.relative_to(root)): list(pd.read_csv(p, nrows=0).columns) for p in sorted(root.rglob("*.csv"))}


def check_schema(reference: Path, slurm: Path) -> None:
    expected, got = csv_columns(reference), csv_columns(slurm)
    require(bool(expected), f"no CSV files under the reference {reference}")
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    require(not missing and not extra, f"CSV files differ from the local run: missing {missing}, extra {extra}")
    differing = [f"{rel}: {expected[rel]} vs {got[rel]}" for rel in expected if expected[rel] != got[rel]]
    require(not differing, "columns differ from the local run:\n  " + "\n  ".join(differing))
    print(f"ok  {len(expected)} CSV files with the same columns as the local run")


def main(argv: Iterable[str]) -> int:
    command, *args = argv
    checks = {"probe": check_probe, "jobs": check_jobs, "schema": check_schema}
    try:
        checks[command](*map(Path, args))
    except CheckFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
