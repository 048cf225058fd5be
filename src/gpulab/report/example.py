"""An example report that needs no GPU: the recorded runs under ``tests/fixtures`` rendered side by side.

The ``h100`` target is assembled from the recorded NVIDIA H100 runs (benchmarks with their ceilings and
environment, builds, MLP profile, LLM engines; each area from its own run, see each area's README) and
the ``cpu`` target is the recorded CPU run of the whole default workflow. Nothing is measured or changed:
the files are copied as recorded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gpulab.core.jobenv import available_cores
from gpulab.report.render import RenderedReport, render_report

# (fixture directory, path inside it, path inside results/<target>/) of each recorded area.
H100_AREAS = (
    ("bench/h100", "bench", "bench"),
    ("bench/h100", "env", "env"),
    ("build/results/h100", "build", "build"),
    ("mlp/h100", "mlp", "mlp"),
    ("mlp/h100", "logs", "logs"),
    ("llm/results/h100", "llm", "llm"),
)
CPU_RUN = "report/results/cpu"
# The recorded run's rule outputs: the methodology's critical path and the summary's log links need them.
RULE_OUTPUTS = "report/rule_outputs.json"
TITLE = "gpulab example report: recorded H100 and CPU runs"


def assemble(fixtures: Path, results: Path) -> Path:
    """``results/h100`` and ``results/cpu`` copied from the recorded fixtures; returns ``results``."""
    required = [fixtures / area / inner for area, inner, _ in H100_AREAS] + [fixtures / CPU_RUN]
    missing = [path for path in required if not path.is_dir()]
    if missing:
        raise FileNotFoundError(f"recorded fixtures not found: {', '.join(map(str, missing))} "
                                "(run from a gpulab checkout, or pass --fixtures <checkout>/tests/fixtures)")
    if results.exists():
        shutil.rmtree(results)
    for area, inner, dest in H100_AREAS:
        shutil.copytree(fixtures / area / inner, results / "h100" / dest, dirs_exist_ok=True)
    shutil.copytree(fixtures / CPU_RUN, results / "cpu")
    return results


def render_example(fixtures: Path, out_dir: Path, config: dict[str, Any], command: str) -> RenderedReport:
    """``out_dir/results/`` assembled from ``fixtures`` and rendered into ``out_dir/report.html``."""
    results = assemble(fixtures, out_dir / "results")
    rule_outputs = fixtures / RULE_OUTPUTS
    if rule_outputs.is_file():
        config = {**config, "_workflow": {"rule_outputs": json.loads(rule_outputs.read_text())}}
    return render_report(results, out_dir / "report.html", config, command, title=TITLE, workers=available_cores())
