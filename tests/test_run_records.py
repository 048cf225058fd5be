"""What the workflow records about its own run: the source files each step depends on, the failure summary,
the critical path of the benchmark records, and the report's refusal of cut-off tables."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from gpulab.bench.sizes import resolve_sizes
from gpulab.core.device import detect
from gpulab.report.results import ResultsIndex
from gpulab.report.sections.methodology import critical_path
from gpulab.workflow.failures import failure_summary, final_error, log_offsets
from gpulab.workflow.sources import PACKAGE_DIRS, code_digest, kernel_sources, step_sources

REPO = Path(__file__).resolve().parent.parent


def test_step_sources_are_the_import_closure_and_data_files():
    cell = step_sources("bench_cell.py", REPO)
    assert {"workflow/scripts/bench_cell.py", "src/gpulab/bench/runner.py", "src/gpulab/bench/impls.py",
            "src/gpulab/core/timing.py", "src/gpulab/bench/__init__.py"} <= set(cell)
    assert not any(p.startswith(("src/gpulab/llm/", "src/gpulab/mlp/", "src/gpulab/report/"))
                   for p in cell)
    # The op kernels are inputs per implementation (below), though the implementation registry imports them all.
    assert not {"kernels/triton/gelu.py", "kernels/triton/softmax.py", "kernels/triton/add.py"} & set(cell)
    # Kernels imported as gpulab.kernels are followed into kernels/, relative imports included.
    assert {"kernels/triton/ceiling.py", "kernels/triton/__init__.py", "kernels/__init__.py"} <= set(cell)
    compile_ = step_sources("kernels_compile.py", REPO)
    assert {"kernels/triton/launches.py", "kernels/triton/config.py", "src/gpulab/toolchains/job.py"} <= set(
        compile_)
    assert "kernels/ext/ops.cpp" in step_sources("build_extension.py", REPO)
    assert "src/gpulab/llm/fast.py" in step_sources("llm_infer.py", REPO)
    assert "src/gpulab/mlp/model.py" in step_sources("mlp_profile.py", REPO)
    assert "src/gpulab/report/sections/methodology.py" in step_sources("report_render.py", REPO)
    assert all((REPO / p).is_file() and not Path(p).is_absolute() for p in step_sources("llm_infer.py", REPO))


def test_the_code_digest_follows_content_not_file_times_or_the_checkouts_place(tmp_path):
    files = step_sources("bench_aggregate.py", REPO)
    copies = []
    for name in ("one", "two"):
        root = tmp_path / name
        for rel in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes((REPO / rel).read_bytes())
        copies.append(root)
    one, two = copies
    digest = code_digest(files, one)
    assert len(digest) == 16 and digest == code_digest(files, two) == code_digest(reversed(files), REPO)
    os.utime(two / files[0], (1, 1))
    assert code_digest(files, two) == digest
    edited = two / "workflow/scripts/bench_aggregate.py"
    edited.write_text(edited.read_text() + "# a comment\n")
    from gpulab.workflow import sources

    sources._content_digest.cache_clear()  # one process sees each file once; a new run reads it anew
    assert code_digest(files, two) != digest


def test_the_kernels_package_is_the_top_level_kernels_directory():
    link = REPO / "src" / "gpulab" / "kernels"
    assert link.is_symlink() and link.resolve() == (REPO / "kernels").resolve()
    assert PACKAGE_DIRS == {"gpulab": "src/gpulab", "gpulab.kernels": "kernels"}


def test_kernel_sources_per_implementation():
    assert kernel_sources("triton", "softmax", REPO) == [
        "kernels/__init__.py", "kernels/triton/__init__.py", "kernels/triton/aot.py", "kernels/triton/config.py",
        "kernels/triton/softmax.py"]
    assert kernel_sources("triton", "gelu", REPO) == [
        "kernels/__init__.py", "kernels/triton/__init__.py", "kernels/triton/config.py", "kernels/triton/gelu.py"]
    assert all((REPO / p).is_file() for op in ("gelu", "softmax", "add") for p in kernel_sources("triton", op, REPO))
    assert kernel_sources("native", "gelu", REPO) == []


def test_a_cell_gets_its_ops_own_list_of_sizes():
    info = detect()
    # What workflow/rules/bench.smk hands a cell: the op's own list from bench.sizes.
    assert resolve_sizes("gelu", [1048576, 1048576, 5], info) == [(1048576,), (5,)]
    assert resolve_sizes("softmax", [[4096, 1024]], info) == [(4096, 1024)]
    with pytest.raises(ValueError, match=r"the sizes of softmax"):
        resolve_sizes("softmax", "big", info)


def test_failure_summary_reads_only_what_this_run_added(tmp_path):
    logs = tmp_path / "results/local/logs"
    logs.mkdir(parents=True)
    old = logs / "bench_cell_gelu__triton.log"
    old.write_text("Traceback (most recent call last):\n  File x\nValueError: from an earlier run\n")
    offsets = log_offsets(tmp_path / "results")
    old.write_text(old.read_text() + "Traceback (most recent call last):\n  File \"s.py\", line 3\n"
                   "gpulab.core.tables.StrictModeError: strict mode: 1 outcome(s) of bench gelu/triton are not ok:\n"
                   "  - skipped: Triton needs a GPU [op=gelu, size=4096]\n2026 INFO later line\n")
    (logs / "env_capture.log").write_text("all fine\n")
    summary = failure_summary(tmp_path / "results", offsets)
    assert summary.startswith("gpulab: 1 step(s) failed")
    assert "bench_cell_gelu__triton.log" in summary and "Triton needs a GPU [op=gelu, size=4096]" in summary
    assert "earlier run" not in summary and "later line" not in summary
    assert failure_summary(tmp_path / "results", log_offsets(tmp_path / "results")) is None
    # A log Snakemake replaced (shorter than before) is this run's output from its start.
    offsets = log_offsets(tmp_path / "results")
    old.unlink()
    old.write_text("Traceback (most recent call last):\n  File x\nOSError: disk full\n")
    assert "OSError: disk full" in failure_summary(tmp_path / "results", offsets)
    assert final_error("no traceback here") is None


def record(job, rule, seconds, inputs, **wildcards):
    return {"job": job, "rule_name": rule, "s": seconds, "wildcards": {"target": "t", **wildcards},
            "input_size_mb": {p: 0.0 for p in inputs}}


def test_critical_path_follows_inputs_and_wall_time():
    outputs = {"env": ["results/{target}/env/env.json"], "cell": ["results/{target}/bench/cells/{op}.csv"],
               "agg": ["results/{target}/bench/{op}.csv"], "build": ["results/{target}/build/ext.csv"]}
    records = [
        record("env", "env", 10, ["src/gpulab/env/capture.py"]),
        record("build", "build", 30, ["results/t/env/env.json"]),
        record("cell_a", "cell", 5, ["results/t/env/env.json"], op="a"),
        record("cell_b", "cell", 50, ["results/t/env/env.json", "results/t/build/ext.csv"], op="b"),
        record("agg_a", "agg", 1, ["results/t/bench/cells/a.csv"], op="a"),
        record("agg_b", "agg", 1, ["results/t/bench/cells/b.csv"], op="b"),
    ]
    assert critical_path(records, outputs) == ["env", "build", "cell_b", "agg_b"]
    # Without the dependency on the build, the build (40 s) no longer lies on the longest chain (61 s).
    records[3]["input_size_mb"] = {"results/t/env/env.json": 0.0}
    assert critical_path(records, outputs) == ["env", "cell_b", "agg_b"]
    assert critical_path([], outputs) == []


@pytest.mark.parametrize("cut", ["mid_row", "header_only_columns", "empty_required"])
def test_report_refuses_a_truncated_table(tmp_path, cut):
    results = tmp_path / "results"
    shutil.copytree(REPO / "tests/fixtures/report/results", results)
    path = results / "cpu/bench/gelu.csv"
    text = path.read_text()
    if cut == "mid_row":
        text = text[: len(text) - 40]  # still parses: the last row's trailing cells read as empty
    elif cut == "header_only_columns":
        lines = text.splitlines()
        text = "\n".join(",".join(line.split(",")[3:]) for line in lines) + "\n"
    else:
        lines = text.splitlines()
        text = "\n".join([lines[0], "," * lines[0].count(","), *lines[1:]]) + "\n"
    path.write_text(text)
    index = ResultsIndex(results)
    assert index.table("bench/gelu.csv").empty
    # A table lacking columns is not called truncated: the columns it lacks are named.
    why = "the table lacks column(s) target, status" if cut == "header_only_columns" else "truncated table"
    assert any(p.path == "cpu/bench/gelu.csv" and why in p.message for p in index.problems), index.problems


def _refresh_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("refresh", REPO / "tests" / "fixtures" / "refresh.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["refresh"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_fixture_refresh_copies_each_areas_results_and_leaves_out_intermediates(tmp_path, monkeypatch):
    import json

    refresh = _refresh_module()
    monkeypatch.setattr(refresh, "HERE", tmp_path / "fixtures")
    run = tmp_path / "results" / "local"
    files = {"env/env.json": json.dumps({"target": "local", "device": {"gpu_available": False}}),
             "bench/gelu.csv": "target,fingerprint,status\nlocal,abc123,ok\n", "bench/cells/gelu__native.csv": "x\n",
             "logs/bench_cell_gelu__native.log": "ran\n", "llm/models/tiny/config.json": "{}",
             "llm/tiny__hf.csv": "target,status\nlocal,ok\n", "mlp/summary.csv": "target,status\nlocal,ok\n",
             "../benchmarks/report_render.jsonl": json.dumps({"params": {"rule_outputs": {"all": []}}}) + "\n"}
    for rel, text in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    (run / "mlp" / "trace_fp32.json.gz").write_bytes(b"0" * (refresh.MAX_FILE_BYTES + 1))

    report = refresh.refresh(run, "report")
    kept = {p.relative_to(report).as_posix() for p in report.rglob("*") if p.is_file()}
    assert kept == {"env/env.json", "bench/gelu.csv", "logs/bench_cell_gelu__native.log", "llm/tiny__hf.csv",
                    "mlp/summary.csv"}  # no intermediate, no model, nothing too large
    assert report == tmp_path / "fixtures/report/results/cpu"
    assert "cpu,abc123,ok" in (report / "bench/gelu.csv").read_text()  # renamed, its fingerprint kept
    assert json.loads((tmp_path / "fixtures/report/rule_outputs.json").read_text()) == {"all": []}

    bench = refresh.refresh(run, "bench", name="h100")
    assert {p.name for p in bench.rglob("*") if p.is_file()} == {"gelu.csv", "env.json"}
    assert "local,abc123,ok" in (bench / "bench/gelu.csv").read_text()  # a GPU area keeps the run's target
    (run / "env/env.json").write_text(json.dumps({"device": {"gpu_available": True, "name": "H100"}}))
    with pytest.raises(SystemExit, match="CPU run"):
        refresh.refresh(run, "report")


def test_the_methodology_gives_the_device_jobs_time_beside_the_critical_path():
    """A local run takes the jobs holding its one ``gpu`` resource one after the other: their summed wall time is
    a floor of its wall time beside the critical path, and on the recorded CPU run it is the larger one."""
    import json
    import re

    from report_fixtures import FIXTURE_RESULTS, two_target_report

    from gpulab.report.sections.methodology import holds_device

    records = [json.loads(p.read_text().splitlines()[0])
               for p in (FIXTURE_RESULTS / "cpu" / "benchmarks").glob("*.jsonl")]
    device = sum(r["s"] for r in records if holds_device(r))
    assert holds_device({"resources": {"gpu": 1}}) and not holds_device({"resources": {"_cores": 1}})
    assert not holds_device({})
    html = two_target_report().path.read_text(encoding="utf-8")
    found = re.search(r"Critical path of <strong>cpu</strong>: ([\d.]+) s.*?The jobs that measure on the device add "
                      r"up to ([\d.]+) s without their waits(:\s*on one device they, not the critical path)?",
                      html, re.S)
    assert found, "the cpu target's critical path and device time"
    assert float(found.group(2)) == pytest.approx(device, abs=0.1)
    assert (float(found.group(2)) > float(found.group(1))) == bool(found.group(3))


def test_a_jobs_wait_for_the_device_is_not_counted_as_its_work(tmp_path):
    """Two device jobs run at once in a local run on a GPU; the one waiting for the device records its wait
    (gpulab.core.device_lock), and the critical path and the device jobs' sum leave that wait out."""
    from types import SimpleNamespace

    from gpulab.report.sections.methodology import _path_summary, step_times

    outputs = {"env": ["results/{target}/env/env.json"], "cell": ["results/{target}/bench/cells/{op}.csv"]}
    records = [{**record("env", "env", 10, []), "resources": {"gpu": 1}},
               {**record("cell_a", "cell", 20, ["results/t/env/env.json"], op="a"), "resources": {"gpu": 1}},
               {**record("cell_b", "cell", 32, ["results/t/env/env.json"], op="b"), "resources": {"gpu": 1}}]
    (tmp_path / "device_waits").mkdir()
    (tmp_path / "device_waits" / "cell_b.jsonl").write_text('{"pid": 7, "claimed_at": 1000.0, "waited_s": 18.0}\n')
    results = SimpleNamespace(targets=["t"], benchmarks=lambda target: records,
                              path=lambda target, rel: tmp_path / rel,
                              read_text=lambda path: path.read_text(encoding="utf-8") if path.is_file() else None)
    times, paths = step_times(SimpleNamespace(results=results, config={"_workflow": {"rule_outputs": outputs}}))
    assert dict(zip(times["step"], times["of it waiting for the device (s)"], strict=True)) == \
        {"env": 0.0, "cell_a": 0.0, "cell_b": 18.0}
    assert paths["t"] == ["env", "cell_a"]  # cell_b worked 14 s of its 32
    summary = _path_summary(times, paths["t"])
    assert summary["seconds"] == pytest.approx(30.0) and summary["device_seconds"] == pytest.approx(44.0)
