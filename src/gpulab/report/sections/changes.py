"""Changes against a baseline run (``gpulab compare BASELINE NEW``): per cell, did it move beyond the noise?

Each artifact of each target present in both runs is matched cell by cell. A cell is flagged faster
or slower only when the 95% bootstrap CI of its ratio of medians excludes 1 and the change is at least
the minimum effect (see :func:`gpulab.report.compare.times_verdict`), and, where both runs timed a reference
beside the case, the time relative to it changed the same way; a changed status is always flagged. Cells whose
settings or device differ are not comparable. The section opens with both runs' device, commit and configuration
digest and the configuration keys that differ; what changed in the environment is listed beside.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.report.compare import (
    AMBIGUOUS,
    FASTER,
    FLAGGED,
    MIN_EFFECT,
    NO_VERDICT,
    NOT_COMPARABLE,
    SLOWER,
    STATUS_CHANGED,
    VERDICTS,
    WITHIN,
    artifact_deltas,
    config_differences,
    env_differences,
    run_summary,
)
from gpulab.report.plots import ratio_strip
from gpulab.report.results import is_measured

ORDER = 15
ID = "changes"
TITLE = "Changes against the baseline run"
TEMPLATE = "changes.html.j2"

VERDICT_COLORS = {FASTER: "#009e73", SLOWER: "#d55e00", WITHIN: "#8c8c8c", STATUS_CHANGED: "#cc79a7",
                  NO_VERDICT: "#e69f00", AMBIGUOUS: "#56b4e9", NOT_COMPARABLE: "#000000"}


def _artifact(name: str, old: dict[str, pd.DataFrame], new: dict[str, pd.DataFrame],
              min_effect: float, devices: tuple[str, str] | None) -> dict[str, Any] | None:
    """One artifact's verdicts against the baseline run (None: nothing worth showing)."""
    if name not in old or name not in new:
        return {"name": name, "only": "baseline" if name in old else "this run",
                "counts": {}, "flagged": pd.DataFrame(), "all": pd.DataFrame()}
    a, b = old[name], new[name]
    deltas = artifact_deltas(name, old, new, min_effect, devices)
    if not (is_measured(a) and is_measured(b)):
        # Nothing timed to compare: only a changed outcome (a check that now fails) is news.
        deltas = deltas[deltas["verdict"] == STATUS_CHANGED]
        if deltas.empty:
            return None
    counts = deltas["verdict"].value_counts().to_dict()
    return {"name": name, "only": None, "counts": {v: int(counts.get(v, 0)) for v in VERDICTS if counts.get(v)},
            "flagged": deltas[deltas["verdict"].isin(FLAGGED)], "all": deltas}


def _target(ctx: Any, target: str, min_effect: float, points: list[dict[str, Any]]) -> dict[str, Any]:
    """One target's runs (device, commit, digest, the configuration keys that differ), its artifacts compared and
    its totals per verdict; measured cells are added to ``points``."""
    baseline_run, new_run = ctx.config.get("_runs") or (None, None)
    sides = run_summary(ctx.baseline, target, baseline_run), run_summary(ctx.results, target, new_run)
    devices = None if ctx.config.get("_across_devices") else (sides[0].device, sides[1].device)
    old, new = dict(ctx.baseline.artifacts(target)), dict(ctx.results.artifacts(target))
    names = [n for n in sorted(set(old) | set(new)) if not n.startswith("env/")]
    artifacts = [a for a in (_artifact(n, old, new, min_effect, devices) for n in names) if a is not None]
    totals: dict[str, int] = {}
    for artifact in artifacts:
        for verdict, n in artifact["counts"].items():
            totals[verdict] = totals.get(verdict, 0) + n
        if artifact["only"]:
            continue
        deltas = artifact["all"]
        judged = (FASTER, SLOWER, AMBIGUOUS, WITHIN, NO_VERDICT)
        measured = deltas[deltas["change_pct"].notna() & deltas["verdict"].isin(judged)]
        points += [{"cell": f"{target} · {artifact['name'].rsplit('.', 1)[0]}", "verdict": row["verdict"],
                    "time ratio (new / baseline)": 1 + row["change_pct"] / 100} for _, row in measured.iterrows()]
    runs = pd.DataFrame([{"run": label, "device": side.device, "commit": side.commit, "config digest": side.digest}
                         for label, side in zip(("baseline", "this run"), sides, strict=True)])
    return {"name": target, "runs": runs, "config_diff": config_differences(*sides),
            "devices_differ": sides[0].device != sides[1].device, "across_devices": devices is None,
            "digests_differ": "–" not in (sides[0].digest, sides[1].digest) and sides[0].digest != sides[1].digest,
            "env_diff": env_differences(ctx.baseline.env(target), ctx.results.env(target)),
            "artifacts": artifacts, "totals": {v: totals[v] for v in VERDICTS if v in totals}}


def build(ctx: Any) -> dict[str, Any] | None:
    if ctx.baseline is None:
        return None
    new_targets, old_targets = set(ctx.results.targets), set(ctx.baseline.targets)
    min_effect = float(ctx.config.get("_min_effect", MIN_EFFECT))
    points: list[dict[str, Any]] = []
    targets = [_target(ctx, target, min_effect, points) for target in sorted(new_targets & old_targets)]
    overview = None
    if points:
        frame = pd.DataFrame(points)
        overview = ratio_strip(
            frame, ratio="time ratio (new / baseline)", row="cell", hue="verdict", hue_colors=VERDICT_COLORS,
            xlabel="median time, this run / baseline (log scale; left of the line: faster)",
            alt="Per-cell change of the median time against the baseline run, coloured by verdict",
            caption="Each dot is one cell measured in both runs; grey dots did not change significantly. "
                    "Diamonds are geometric means per artifact.",
        )
    return {
        "baseline_dir": str(ctx.baseline.root),
        "results_dir": str(ctx.results.root),
        "targets": targets,
        "only_baseline": sorted(old_targets - new_targets),
        "only_new": sorted(new_targets - old_targets),
        "overview": overview,
        "min_effect_pct": 100 * min_effect,
    }
