"""Methodology: how every number was obtained (timing, correctness, ceilings, comparisons) and how to rerun.

The prose is written against the code it describes; the settings in it are read from the effective
configuration and from the timing columns the rows actually carry, so the page cannot drift from what
ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import pandas as pd

from gpulab.core.ceilings import CEILINGS, RAISE_LIMIT
from gpulab.core.device_lock import WAITS_DIR, read_waits, waited_s
from gpulab.core.patterns import PATTERNS
from gpulab.core.timing import (
    CPU_FLUSH_BYTES,
    CPU_MAX_WALL_S,
    CPU_MIN_SPAN_S,
    CPU_MIN_TIME_S,
    GPU_FLUSH_BYTES,
    GPU_MAX_WALL_S,
    GPU_MIN_SPAN_S,
    GPU_MIN_TIME_S,
    MAX_CV,
    MAX_MEAN_OVER_MEDIAN,
    MIN_STABLE_REPS,
    TimingSettings,
)
from gpulab.env.capture import git_state
from gpulab.report import findings
from gpulab.report.results import is_measured, job_outputs
from gpulab.workflow.config import config_hash

ORDER = 90
ID = "methodology"
TITLE = "Methodology & reproduction"
TEMPLATE = "methodology.html.j2"


def timing_in_use(ctx: Any) -> pd.DataFrame:
    """Per target and artifact: the timer, cache policy, repetitions and spread the measured rows report."""
    rows = []
    for target in ctx.results.targets:
        for relpath, frame in ctx.results.artifacts(target):
            if not is_measured(frame):
                continue
            ok = frame[frame["status"] == "ok"]
            if ok.empty:
                continue
            reps = pd.to_numeric(ok.get("reps"), errors="coerce") if "reps" in ok else pd.Series(dtype=float)
            cv = pd.to_numeric(ok.get("cv"), errors="coerce") if "cv" in ok else pd.Series(dtype=float)
            first = pd.to_numeric(ok.get("first_call_ms"), errors="coerce") if "first_call_ms" in ok else None
            rows.append({
                "target": target,
                "artifact": relpath,
                "rows": len(ok),
                "timer": ", ".join(sorted(ok["timer"].dropna().astype(str).unique())) if "timer" in ok else "–",
                "cache policy": ", ".join(sorted(ok["cache_policy"].dropna().astype(str).unique()))
                if "cache_policy" in ok else "–",
                "reps (min–max)": f"{int(reps.min())}–{int(reps.max())}" if reps.notna().any() else "–",
                "median cv": float(cv.median()) if cv.notna().any() else float("nan"),
                "worst cv": float(cv.max()) if cv.notna().any() else float("nan"),
                "max first call (ms)": float(first.max())
                if first is not None and first.notna().any() else float("nan"),
            })
    return pd.DataFrame(rows)


def ceilings_table(ctx: Any) -> pd.DataFrame:
    frame = ctx.results.table(CEILINGS.path)
    if frame.empty:
        return frame
    from gpulab.report.sections.bench import with_regime

    frame = with_regime(frame)
    keep = [c for c in ("target", "kind", "dtype", "size", "method", "gbps", "tflops", "regime", "median_ms", "cv",
                        "reps", "stable") if c in frame.columns]
    # The ceilings themselves; every method's row is in the benchmark section.
    if "best" in frame.columns:
        frame = frame[frame["best"].astype(str).str.lower() == "true"]
    return frame[keep]


SWEEP = re.compile(r"^triton b\d+ w\d+$")
METHOD_WORDS = {"triton": "a Triton kernel swept over block sizes and warp counts",
                "cpp_ext": "the C++ extension's kernel"}


def ceiling_methods(ceilings: pd.DataFrame) -> list[dict[str, Any]]:
    """Per ceiling kind, the methods this run measured and those it recorded as skipped (with the reason), read
    from the ceilings table so the text says what the table holds."""
    if ceilings.empty or "method" not in ceilings.columns:
        return []
    frame = ceilings.assign(name=ceilings["method"].astype(str).str.replace(SWEEP, "triton", regex=True))
    out = []
    for kind, rows in frame.groupby("kind", sort=False):
        ran = rows[rows["status"] == "ok"]["name"]
        skipped = rows[(rows["status"] != "ok") & ~rows["name"].isin(ran)].drop_duplicates("name")
        out.append({"kind": kind, "ran": [METHOD_WORDS.get(m, m) for m in dict.fromkeys(ran)],
                    "skipped": [{"method": METHOD_WORDS.get(r.name, r.name), "reason": r.reason}
                                for r in skipped.itertuples()]})
    order = {k: i for i, k in enumerate(PATTERNS)}
    return sorted(out, key=lambda m: order.get(m["kind"], 9))


def correctness_thresholds(config: dict[str, Any]) -> pd.DataFrame | None:
    """The benchmark step's per-dtype error thresholds (its defaults, overridden by ``bench.tolerances``)."""
    try:
        from gpulab.bench import correctness
    except ImportError:
        return None
    defaults = getattr(correctness, "THRESHOLDS", None)
    if not isinstance(defaults, dict) or not defaults:
        return None
    overrides = (config.get("bench") or {}).get("tolerances") or {}
    from gpulab.core.ops import ELEMENT_TOLERANCES

    return pd.DataFrame([{"dtype": k, "max relative error": overrides.get(k, v),
                          "from": "config bench.tolerances" if k in overrides else "default",
                          "per element: atol (× rms of ref)": ELEMENT_TOLERANCES[k][0],
                          "per element: rtol": ELEMENT_TOLERANCES[k][1]}
                         for k, v in defaults.items()])


def critical_path(records: Sequence[Mapping[str, Any]], rule_outputs: Mapping[str, Sequence[str]]) -> list[str]:
    """The chain of jobs, each needing the previous one's output, with the largest total wall time.

    A job depends on another when one of its recorded inputs is among the other's outputs; the run cannot
    finish sooner than this chain, however many cores it has."""
    outputs = {r["job"]: job_outputs(r, rule_outputs) for r in records}
    preds = {
        r["job"]: [j for j, produced in outputs.items()
                   if j != r["job"] and produced & {os.path.normpath(p) for p in r.get("input_size_mb") or {}}]
        for r in records
    }
    seconds = {r["job"]: float(r.get("s") or 0.0) for r in records}

    @cache
    def longest(job: str) -> tuple[float, tuple[str, ...]]:
        best = max((longest(p) for p in preds[job]), default=(0.0, ()))
        return best[0] + seconds[job], (*best[1], job)

    return list(max((longest(j) for j in preds), default=(0.0, ()))[1])


def _params_hash(params: Any) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _device_wait(ctx: Any, target: str, job: str) -> float:
    """Seconds the job waited for another job's measurements (its wait record, gpulab.core.device_lock)."""
    return waited_s(read_waits(ctx.results.path(target, f"{WAITS_DIR}/{job}.jsonl")))


def step_times(ctx: Any) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Per target and job: wall time, the part of it spent waiting for the device, CPU time and peak memory from
    Snakemake's benchmark records, the hash of the job's params (its part of the configuration) and whether it is
    on the critical path (judged on the time each job worked, without its wait)."""
    rule_outputs = (ctx.config.get("_workflow") or {}).get("rule_outputs") or {}
    rows, paths = [], {}
    for target in ctx.results.targets:
        records = ctx.results.benchmarks(target)
        waits = {r["job"]: _device_wait(ctx, target, r["job"]) for r in records}
        worked = [{**r, "s": max(0.0, float(r.get("s") or 0.0) - waits[r["job"]])} for r in records]
        path = critical_path(worked, rule_outputs) if rule_outputs else []
        paths[target] = path
        for r in records:
            rows.append({
                "target": target,
                "step": r["job"],
                "wall (s)": float(r.get("s") or 0.0),
                "of it waiting for the device (s)": waits[r["job"]],
                "CPU (s)": pd.to_numeric(r.get("cpu_time"), errors="coerce"),
                "max RSS (MB)": pd.to_numeric(r.get("max_rss"), errors="coerce"),
                "params hash": _params_hash(r["params"]) if "params" in r else "–",
                "critical path": "yes" if r["job"] in path else "",
                "measures on the device": "yes" if holds_device(r) else "",
            })
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["target", "wall (s)"], ascending=[True, False], ignore_index=True)
    return frame, paths


def holds_device(record: Mapping[str, Any]) -> bool:
    """Whether the job held the ``gpu`` resource (its measurements): a local run on one device runs them one at a
    time."""
    return bool((record.get("resources") or {}).get("gpu"))


def _path_summary(times: pd.DataFrame, path: list[str]) -> dict[str, Any]:
    """The critical path's steps and time, and the device jobs' summed time (a local run on one device measures
    them one at a time, so it cannot finish sooner than either), against the time of all steps; each job's time
    without its wait for the device."""
    worked = times["wall (s)"] - times["of it waiting for the device (s)"]
    return {"steps": path, "seconds": float(worked[times["step"].isin(path)].sum()),
            "device_seconds": float(worked[times["measures on the device"] == "yes"].sum()),
            "total": float(worked.sum())}


def step_params(ctx: Any) -> pd.DataFrame:
    """Each job's params as it ran (extended benchmark records): the configuration every step really used."""
    rows = [{"target": t, "step": r["job"], "params hash": _params_hash(r["params"]),
             "params": json.dumps(r["params"], sort_keys=True, default=str)}
            for t in ctx.results.targets for r in ctx.results.benchmarks(t) if "params" in r]
    return pd.DataFrame(rows)


def build(ctx: Any) -> dict[str, Any] | None:
    timing = TimingSettings.from_config(ctx.config.get("timing"))
    envs = {t: ctx.results.env(t) or {} for t in ctx.results.targets}
    provenance = pd.DataFrame([{
        "target": t,
        "fingerprint": env.get("fingerprint", "–"),
        "workflow commit": ((env.get("git") or {}).get("commit") or "–")[:12],
        "uncommitted changes": (env.get("git") or {}).get("dirty"),
        "captured": env.get("captured_at", "–"),
        "host": env.get("host", "–"),
    } for t, env in envs.items()])
    config = {k: v for k, v in ctx.config.items() if not k.startswith("_")}
    page_hash = config_hash(config)
    times, paths = step_times(ctx)
    return {
        "timing": timing,
        "gpu_flush_mib": GPU_FLUSH_BYTES // 2**20,
        "cpu_flush_mib": CPU_FLUSH_BYTES // 2**20,
        "spans": f"{CPU_MIN_SPAN_S:g} s (CPU) or {GPU_MIN_SPAN_S:g} s (GPU)",
        "min_times": f"{GPU_MIN_TIME_S:g} s (GPU) or {CPU_MIN_TIME_S:g} s (CPU)",
        "walls": f"{GPU_MAX_WALL_S:g} s (GPU) or {CPU_MAX_WALL_S:g} s (CPU)",
        "in_use": timing_in_use(ctx),
        "ceilings": ceilings_table(ctx),
        "kind_words": {name: p.words for name, p in PATTERNS.items()},
        "raise_pct": round(100 * (RAISE_LIMIT - 1)),
        "rule": {"ratio": f"{MAX_MEAN_OVER_MEDIAN:.2f}", "cv": f"{MAX_CV:.2f}", "reps": MIN_STABLE_REPS},
        "ceiling_methods": ceiling_methods(ctx.results.table(CEILINGS.path)),
        "above": pd.concat([findings.above_ceiling(ctx.results, t) for t in ctx.results.targets], ignore_index=True),
        "gpu": any((ctx.results.env(t) or {}).get("device", {}).get("gpu_available") for t in ctx.results.targets),
        "ceiling_config": ctx.config.get("ceilings", {}),
        "thresholds": correctness_thresholds(ctx.config),
        "provenance": provenance,
        "page_hash": page_hash,
        "step_times": times,
        "critical_paths": {t: _path_summary(times[times["target"] == t], p) for t, p in paths.items() if p},
        "rule_outputs_known": bool((ctx.config.get("_workflow") or {}).get("rule_outputs")),
        "step_params": step_params(ctx),
        "config": config,
        "command": ctx.command,
        "git": git_state(),
        "results_dir": str(ctx.results.root),
        "baseline_dir": str(ctx.baseline.root) if ctx.baseline is not None else None,
    }
