"""Summary: per target, the device and what ran, was skipped, failed or was incorrect, and why."""

from __future__ import annotations

from typing import Any

import pandas as pd

ORDER = 10
ID = "summary"
TITLE = "Summary"
TEMPLATE = "summary.html.j2"


def build(ctx: Any) -> dict[str, Any] | None:
    targets = []
    for target in ctx.results.targets:
        env = ctx.results.env(target) or {}
        device = env.get("device", {})
        counts: list[dict[str, Any]] = []
        problems: list[dict[str, Any]] = []
        for relpath, frame in ctx.results.outcome_files(target):
            step = relpath.rsplit(".", 1)[0]
            row = {
                "artifact": step,
                **{s: int((frame["status"] == s).sum()) for s in ("ok", "skipped", "failed", "incorrect", "oom")},
            }
            counts.append(row)
            log_dir = ctx.results.path(target, "logs")
            for reason, group in frame[frame["status"] != "ok"].groupby(["status", "reason"], dropna=False):
                status, why = reason
                problems.append(
                    {
                        "artifact": step,
                        "status": status,
                        "rows": len(group),
                        "reason": why if isinstance(why, str) and why else "(no reason recorded)",
                        "logs": ctx.link(log_dir) if log_dir.exists() else None,
                    }
                )
        targets.append(
            {
                "name": target,
                "device": device.get("name", "unknown"),
                "backend": device.get("backend", "unknown"),
                "reason": device.get("reason", ""),
                "fingerprint": env.get("fingerprint", "–"),
                "counts": pd.DataFrame(counts),
                "problems": problems,
            }
        )
    return {"targets": targets}
