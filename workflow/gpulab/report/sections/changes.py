"""Changes against a baseline run (``gpulab compare BASELINE NEW``): per cell, did it move beyond the noise?

Each artifact of each target present in both runs is matched cell by cell. A cell is flagged faster
or slower only when the p10..p90 ranges of the two runs do not overlap (see
:func:`gpulab.report.compare.spread_verdict`); a changed status is always flagged. What changed in the
environment between the two runs is listed beside, since it is usually the explanation.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpulab.report.compare import FLAGGED, STATUS_CHANGED, VERDICTS, env_differences, run_deltas
from gpulab.report.plots import ratio_strip
from gpulab.report.results import is_measured

ORDER = 15
ID = "changes"
TITLE = "Changes against the baseline run"
TEMPLATE = "changes.html.j2"

VERDICT_COLORS = {"faster": "#009e73", "slower": "#d55e00", "within spread": "#8c8c8c",
                  "status changed": "#cc79a7", "no spread recorded": "#e69f00"}


def build(ctx: Any) -> dict[str, Any] | None:
    if ctx.baseline is None:
        return None
    new_targets, old_targets = set(ctx.results.targets), set(ctx.baseline.targets)
    common = sorted(new_targets & old_targets)
    targets = []
    points = []
    for target in common:
        env_diff = env_differences(ctx.baseline.env(target), ctx.results.env(target))
        old = dict(ctx.baseline.artifacts(target))
        new = dict(ctx.results.artifacts(target))
        artifacts = []
        for name in sorted(set(old) | set(new)):
            if name.startswith("env/"):
                continue
            if name not in old or name not in new:
                artifacts.append({"name": name, "only": "baseline" if name in old else "this run",
                                  "counts": {}, "flagged": pd.DataFrame(), "all": pd.DataFrame()})
                continue
            a, b = old[name], new[name]
            deltas = run_deltas(a, b)
            if not (is_measured(a) and is_measured(b)):
                # Nothing timed to compare: only a changed outcome (a check that now fails) is news.
                deltas = deltas[deltas["verdict"] == STATUS_CHANGED]
                if deltas.empty:
                    continue
            counts = deltas["verdict"].value_counts().to_dict()
            flagged = deltas[deltas["verdict"].isin(FLAGGED)]
            artifacts.append({"name": name, "only": None,
                              "counts": {v: int(counts.get(v, 0)) for v in VERDICTS if counts.get(v)},
                              "flagged": flagged, "all": deltas})
            measured = deltas[deltas["change_pct"].notna() & deltas["verdict"].isin(
                ("faster", "slower", "within spread", "no spread recorded"))]
            for _, row in measured.iterrows():
                points.append({"cell": f"{target} · {name.rsplit('.', 1)[0]}", "verdict": row["verdict"],
                               "time ratio (new / baseline)": 1 + row["change_pct"] / 100})
        totals: dict[str, int] = {}
        for artifact in artifacts:
            for verdict, n in artifact["counts"].items():
                totals[verdict] = totals.get(verdict, 0) + n
        targets.append({"name": target, "env_diff": env_diff, "artifacts": artifacts,
                        "totals": {v: totals[v] for v in VERDICTS if v in totals}})
    overview = None
    if points:
        frame = pd.DataFrame(points)
        overview = ratio_strip(
            frame, ratio="time ratio (new / baseline)", row="cell", hue="verdict", hue_colors=VERDICT_COLORS,
            xlabel="median time, this run / baseline (log scale; left of the line: faster)",
            alt="Per-cell change of the median time against the baseline run, coloured by verdict",
            caption="Each dot is one cell measured in both runs; grey dots moved less than the measured spread. "
                    "Diamonds are geometric means per artifact.",
        )
    return {
        "baseline_dir": str(ctx.baseline.root),
        "results_dir": str(ctx.results.root),
        "targets": targets,
        "only_baseline": sorted(old_targets - new_targets),
        "only_new": sorted(new_targets - old_targets),
        "overview": overview,
    }
