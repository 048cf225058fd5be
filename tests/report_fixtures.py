"""Results directories for the report tests, built from ``tests/fixtures/report/results/``.

``cpu`` there is a recorded run of this workflow on the project's CPU-only dev machine. A second target,
``synthetic-gpu``, is derived from it here with *synthetic* numbers (times divided by 20, throughputs
multiplied by 20) and the runtime stack the study recorded on its ROCm machine, so the two-target
layout of the report can be tested without GPU results. Its device name says it is a fixture; these
numbers are never shown as measurements anywhere but in tests.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.timing import format_blocks, parse_blocks
from gpulab.env.runtime_stack import RUNTIME_STACK, stack_rows
from gpulab.report.render import RenderedReport, render_report
from gpulab.workflow.config import validate_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_RESULTS = FIXTURES / "report" / "results"
SYNTHETIC_TARGET = "synthetic-gpu"
SYNTHETIC_DEVICE = "Synthetic AMD GPU (test fixture: numbers derived from the CPU run, not measured)"
SPEED_UP = 20.0
# With the workflow's rule outputs the report passes its render step (the run's, kept by refresh.py), so the
# methodology's critical path and the summary's log links are those of a real run.
CONFIG: dict[str, Any] = {**validate_config({}), "_workflow": {
    "rule_outputs": json.loads((FIXTURES / "report" / "rule_outputs.json").read_text())}}


def _schemas() -> dict[str, Any]:
    """The steps' own schemas, by artifact path: fixture tables must keep matching them."""
    from gpulab.core.ceilings import CEILINGS
    from gpulab.env.capture import TOOLS

    schemas: dict[str, Any] = {"env/tools.csv": TOOLS, "env/runtime_stack.csv": RUNTIME_STACK,
                               "bench/ceilings.csv": CEILINGS}
    try:
        from gpulab.bench.runner import BENCH

        schemas["bench/gelu.csv"] = BENCH
    except ImportError:
        pass
    try:
        from gpulab.mlp.profile import MLP_KERNELS, MLP_SUMMARY

        schemas["mlp/summary.csv"] = MLP_SUMMARY
        schemas["mlp/kernels.csv"] = MLP_KERNELS
    except ImportError:
        pass
    return schemas


SCHEMAS = _schemas()


def _scale(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]):
            continue
        name = column.lower()
        if name.endswith("_ms") or name.endswith("_us") or (name.endswith("_s") and "tok_s" not in name):
            out[column] = out[column] / SPEED_UP
        elif any(k in name for k in ("gbps", "tflops", "gflops", "tok_s")):
            out[column] = out[column] * SPEED_UP
    if "timer" in out.columns:
        out["timer"] = out["timer"].where(out["timer"].isna(), "device_event")
    return out


def _synthetic_env(cpu_env: dict[str, Any]) -> dict[str, Any]:
    env = json.loads(json.dumps(cpu_env))
    env.update(target=SYNTHETIC_TARGET, fingerprint="synthetic000", host="fixture")
    env["device"].update(
        backend="rocm", gpu_available=True, name=SYNTHETIC_DEVICE, arch="gfx942", arch_full="gfx942:sramecc+:xnack-",
        total_memory_bytes=192 * 2**30, multiprocessor_count=304, warp_size=64, l2_cache_bytes=4 * 2**20,
        device_count=1, hip_version="7.1.0", cuda_version=None, torch_device="cuda", reason="",
        torch_version="2.9.0+rocm7.1",
    )
    env["packages"]["torch"] = "2.9.0+rocm7.1"
    return env


def make_results(tmp_path: Path, name: str = "results") -> Path:
    """``<tmp>/results`` with the recorded ``cpu`` target and the derived ``synthetic-gpu`` target."""
    root = tmp_path / name
    shutil.copytree(FIXTURE_RESULTS / "cpu", root / "cpu")
    target = root / SYNTHETIC_TARGET
    for path in sorted((root / "cpu").rglob("*")):
        dest = target / path.relative_to(root / "cpu")
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".csv":
            frame = pd.read_csv(path)
            if "target" in frame.columns:
                frame["target"] = SYNTHETIC_TARGET
            if "fingerprint" in frame.columns:
                frame["fingerprint"] = "synthetic000"
            _scale(frame).to_csv(dest, index=False)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    env = _synthetic_env(json.loads((root / "cpu/env/env.json").read_text()))
    (target / "env/env.json").write_text(json.dumps(env, indent=2))
    ldd = (FIXTURES / "env/ldd_libtorch_python_rocm_study.txt").read_text()
    rows = stack_rows([("libtorch_python.so", ldd)], "/opt/venv/lib/python3.13/site-packages/torch/lib")
    base = {"target": SYNTHETIC_TARGET, "fingerprint": "synthetic000", "status": "ok"}
    RUNTIME_STACK.write([{**base, **r} for r in rows], target / "env/runtime_stack.csv")
    return root


def make_run_pair(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A baseline (the recorded CPU run) and a "new run" with one cell slowed well beyond its spread,
    one ok cell turned incorrect, and torch's version changed; returns what was changed."""
    baseline = tmp_path / "baseline"
    shutil.copytree(FIXTURE_RESULTS / "cpu", baseline / "cpu")
    new = tmp_path / "new"
    shutil.copytree(FIXTURE_RESULTS / "cpu", new / "cpu")
    gelu_path = new / "cpu/bench/gelu.csv"
    gelu = pd.read_csv(gelu_path)
    ok = gelu[gelu["status"] == "ok"]
    spread = (ok["p90_ms"] - ok["p10_ms"]) / ok["median_ms"]
    # Slow down the steadiest cell (3x, far outside its p10..p90) and break another one.
    slow = spread.idxmin()
    broken = ok.index[ok.index != slow][-1]
    for column in ("median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms"):
        gelu.loc[slow, column] = gelu.loc[slow, column] * 3
    if "times_ms" in gelu.columns:  # the repetition times the comparison's statistics use
        gelu.loc[slow, "times_ms"] = format_blocks([3 * b for b in parse_blocks(gelu.loc[slow, "times_ms"])])
    gelu.loc[broken, "status"] = "incorrect"
    gelu.loc[broken, "reason"] = "relative error 0.5 exceeds the fp32 tolerance 1e-05 (changed by the test)"
    gelu.to_csv(gelu_path, index=False)
    env_path = new / "cpu/env/env.json"
    env = json.loads(env_path.read_text())
    env["packages"]["torch"] = env["packages"]["torch"] + "-changed-by-test"
    env_path.write_text(json.dumps(env))
    return baseline, new, {"slower": str(gelu.loc[slow, "impl"]), "incorrect": "changed by the test"}


_SHARED = Path(tempfile.mkdtemp(prefix="gpulab-report-tests-"))
atexit.register(shutil.rmtree, _SHARED, ignore_errors=True)


@functools.cache
def two_target_report() -> RenderedReport:
    """The fixture results rendered once per test run (rendering draws ~20 figures): read-only."""
    root = _SHARED / "two-targets"
    results = make_results(root)
    return render_report(results, root / "report.html", CONFIG, "pytest (two-target fixture)")


@functools.cache
def comparison_report() -> tuple[RenderedReport, dict[str, str]]:
    """The recorded run against a copy with one slower and one incorrect cell, rendered once: read-only."""
    root = _SHARED / "compare"
    baseline, new, changed = make_run_pair(root)
    rendered = render_report(new, root / "compare.html", CONFIG, "pytest (comparison fixture)", baseline_dir=baseline)
    return rendered, changed


@functools.cache
def cpu_report() -> str:
    """The recorded CPU run alone, rendered once: its page's HTML (read-only)."""
    root = _SHARED / "cpu"
    shutil.copytree(FIXTURE_RESULTS / "cpu", root / "results" / "cpu")
    return render_report(root / "results", root / "report.html", CONFIG, "pytest (CPU run)").path.read_text()
