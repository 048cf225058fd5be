"""Methodology: how every number was obtained (timing, correctness, ceilings, comparisons) and how to rerun.

The prose is written against the code it describes; the settings in it are read from the effective
configuration and from the timing columns the rows actually carry, so the page cannot drift from what
ran.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.config import config_hash
from gpulab.env_capture import git_state
from gpulab.report.results import is_measured
from gpulab.timing import CPU_FLUSH_BYTES, GPU_FLUSH_BYTES, TimingSettings

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
    frame = ctx.results.table("bench/ceilings.csv")
    if frame.empty:
        return frame
    keep = [c for c in ("target", "status", "kind", "dtype", "size", "method", "gbps", "tflops", "median_ms", "p10_ms",
                        "p90_ms", "cv", "reps", "stable", "timer", "reason") if c in frame.columns]
    # The ceilings themselves; every method's row is in the benchmark section.
    if "best" in frame.columns:
        frame = frame[frame["best"].astype(str).str.lower() == "true"]
    return frame[keep]


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
    from gpulab.bench.ops import ELEMENT_TOLERANCES

    return pd.DataFrame([{"dtype": k, "max relative error": overrides.get(k, v),
                          "from": "config bench.tolerances" if k in overrides else "default",
                          "per element: atol (× rms of ref)": ELEMENT_TOLERANCES[k][0],
                          "per element: rtol": ELEMENT_TOLERANCES[k][1]}
                         for k, v in defaults.items()])


def build(ctx: Any) -> dict[str, Any] | None:
    timing = TimingSettings.from_config(ctx.config.get("timing"))
    envs = {t: ctx.results.env(t) or {} for t in ctx.results.targets}
    provenance = pd.DataFrame([{
        "target": t,
        "fingerprint": env.get("fingerprint", "–"),
        "workflow commit": ((env.get("git") or {}).get("commit") or "–")[:12],
        "uncommitted changes": (env.get("git") or {}).get("dirty"),
        "config hash": env.get("config_hash", "–"),
        "captured": env.get("captured_at", "–"),
        "host": env.get("host", "–"),
    } for t, env in envs.items()])
    config = {k: v for k, v in ctx.config.items() if not k.startswith("_")}
    page_hash = config_hash(ctx.config)
    # Results copied in from another machine or an earlier run were made with their own configuration;
    # only its hash is recorded with them, so say when it is not the one printed below.
    other_config = sorted(t for t, env in envs.items() if env.get("config_hash") not in (None, page_hash))
    return {
        "timing": timing,
        "gpu_flush_mib": GPU_FLUSH_BYTES // 2**20,
        "cpu_flush_mib": CPU_FLUSH_BYTES // 2**20,
        "in_use": timing_in_use(ctx),
        "ceilings": ceilings_table(ctx),
        "ceiling_config": ctx.config.get("ceilings", {}),
        "thresholds": correctness_thresholds(ctx.config),
        "provenance": provenance,
        "page_hash": page_hash,
        "other_config": other_config,
        "config": config,
        "command": ctx.command,
        "git": git_state(),
        "results_dir": str(ctx.results.root),
        "baseline_dir": str(ctx.baseline.root) if ctx.baseline is not None else None,
    }
