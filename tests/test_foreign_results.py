"""Results copied in from another machine are data: cells never lead outside their target, no read blocks or
exhausts memory, and only the tables the workflow writes are read; each refusal is listed on the page."""

from __future__ import annotations

import html
import os
import re
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest

from gpulab.cli import main as gpulab_main
from gpulab.report.results import ResultsIndex

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/fixtures/report/results"
MARKER = "response copied from outside the results"


def _set(path: Path, **cells: str) -> None:
    frame = pd.read_csv(path)
    for column, value in cells.items():
        frame[column] = value
    frame.to_csv(path, index=False)


def _hostile(work: Path) -> Path:
    """A copy of a finished CPU run with a hostile user's cases planted in it; the secret lies beside ``work``."""
    results = work / "results"
    shutil.copytree(FIXTURE, results)
    (work.parent / "secret.json").write_text(f'{{"study": {{"response": "{MARKER}"}}}}\n')
    _set(results / "cpu/llm/tiny__fast.csv", text_file="../../../../secret.json")
    _set(results / "cpu/mlp/summary.csv", trace="/etc/passwd", stacks="../../../../etc/shadow")
    os.mkfifo(results / "cpu/bench/fifo.csv")
    (results / "cpu/bench/zero.csv").symlink_to("/dev/zero")
    with open(results / "cpu/bench/huge.csv", "w") as fh:  # 200 MB, sparse: written in no time
        fh.write("target,status\n")
        fh.truncate(200 * 10**6)
    (results / "cpu/bench/other.csv").write_text("kernel,ms\ngemm,1.0\n")
    (results / "cpu/notes").mkdir()
    (results / "cpu/notes/stray.csv").write_text("target,status\ncpu,ok\n")
    return results


def _problems(page: str) -> str:
    """The page's list of what could not be shown, as text."""
    start = page.index("could not be shown")
    return html.unescape(re.sub(r"<[^>]+>", "", page[start:page.index("</div>", start)]))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile") / "work"
    work.mkdir()
    results = _hostile(work)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        timer = threading.Timer(120, lambda: os._exit(3))  # a blocked read must fail the run, not hang it
        timer.start()
        code = gpulab_main(["report", str(results), "-o", str(work / "report.html")])
        timer.cancel()
    finally:
        os.chdir(cwd)
    assert code == 0
    page = (work / "report.html").read_text(encoding="utf-8")
    return page, _problems(page)


def test_an_llm_text_file_outside_the_target_is_neither_embedded_nor_linked(rendered):
    page, problems = rendered
    assert MARKER not in page and "secret.json\"" not in page
    assert ("cpu/llm/tiny__fast.csv: text_file: '../../../../secret.json' is a path climbing out with ..; "
            "not read, not linked") in problems


def test_mlp_trace_and_stacks_cells_outside_the_target_are_not_linked(rendered):
    page, problems = rendered
    assert not re.search(r'href="[^"]*(passwd|shadow)', page)
    assert "trace of fp32: '/etc/passwd' is an absolute path; not read, not linked" in problems
    assert "stacks of fp32: '../../../../etc/shadow' is a path climbing out with ..; not read, not linked" in problems


def test_a_fifo_named_csv_is_skipped_with_a_note(rendered):
    assert "cpu/bench/fifo.csv: a FIFO; skipped" in rendered[1]


def test_a_csv_linked_to_dev_zero_is_not_read(rendered):
    assert "cpu/bench/zero.csv: a symlink leaving cpu/; not followed" in rendered[1]


def test_a_huge_table_is_skipped_over_the_size_limit_not_taken_for_a_benchmark(rendered):
    page, problems = rendered
    assert "cpu/bench/huge.csv: 190.7 MiB, over the limit of 64.0 MiB (report.max_table_bytes); skipped" in problems
    assert "huge benchmark" not in page


def test_a_table_with_other_columns_names_the_missing_ones_and_is_not_called_truncated(rendered):
    problems = rendered[1]
    assert "cpu/bench/other.csv: not used: the table lacks column(s) target, status, op, impl, dtype, size" in problems
    assert "other.csv: truncated" not in problems


def test_a_file_the_workflow_does_not_write_is_not_a_gpulab_table(rendered):
    page, problems = rendered
    assert "cpu/notes/stray.csv: not a gpulab table; not read" in problems
    assert "stray benchmark" not in page


def test_the_run_itself_still_renders(rendered):
    page = rendered[0]
    assert 'id="llm"' in page and 'id="mlp"' in page and "gelu" in page


# ----------------------------------------------------------------------------- the index on its own


def _target(tmp_path: Path) -> tuple[ResultsIndex, Path]:
    base = tmp_path / "results/t"
    (base / "llm").mkdir(parents=True)
    (base / "bench").mkdir()
    pd.DataFrame({"target": ["t"], "status": ["ok"], "op": ["gelu"], "impl": ["native"], "dtype": ["fp32"],
                  "size": [1024]}).to_csv(base / "bench/gelu.csv", index=False)
    return ResultsIndex(tmp_path / "results"), base


def test_a_symlink_leaving_the_target_is_refused_one_inside_followed(tmp_path):
    index, base = _target(tmp_path)
    (tmp_path / "outside.json").write_text("{}")
    (base / "llm/away.json").symlink_to(tmp_path / "outside.json")
    (base / "llm/real.json").write_text("{}")
    (base / "llm/near.json").symlink_to("real.json")
    assert index.own_file("t", "away.json", under="llm", cell="t/llm/x.csv: text_file") is None
    assert index.own_file("t", "near.json", under="llm") == base / "llm/near.json"
    assert index.problems[0].path == "t/llm/x.csv: text_file"
    assert "'away.json' is a symlink leaving t/" in index.problems[0].message


def test_reading_a_fifo_never_blocks(tmp_path):
    index, base = _target(tmp_path)
    os.mkfifo(base / "env.json")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (index.read_bytes(base / "env.json"), done.set()), daemon=True)
    thread.start()
    assert done.wait(10), "reading a FIFO blocked"
    assert index.problems[0].message == "'env.json' is a FIFO; not read, not linked"


def test_the_size_limit_is_a_setting_gpulab_report_honours(tmp_path, monkeypatch):
    _, base = _target(tmp_path)
    (base / "env").mkdir()
    (base / "env/env.json").write_text('{"device": {"name": "cpu", "backend": "cpu"}}\n')
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("report:\n  max_table_bytes: 16\n")
    assert gpulab_main(["report", "results", "-o", "report.html"]) == 0
    problems = _problems((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert "t/bench/gelu.csv: 60 bytes, over the limit of 16 bytes (report.max_table_bytes); skipped" in problems


# ----------------------------------------------------------------------------- the tables the report knows

# Where each table's schema is declared (module, name), per artifact of gpulab.core.tables.TABLES.
SCHEMAS = {
    "bench/*.csv": ("gpulab.bench.runner", "BENCH"),
    "bench/cells/*__*.csv": ("gpulab.bench.runner", "BENCH"),
    "bench/ceilings.csv": ("gpulab.core.ceilings", "CEILINGS"),
    "mlp/ceilings.csv": ("gpulab.core.ceilings", "CEILINGS"),
    "build/extension.csv": ("gpulab.native.step", "EXTENSION"),
    "build/extension_checks.csv": ("gpulab.native.checks", "EXTENSION_CHECKS"),
    "build/hip_standalone.csv": ("gpulab.native.hip_standalone", "HIP_STANDALONE"),
    "build/kernel_resources.csv": ("gpulab.toolchains", "KERNEL_RESOURCES"),
    "build/kernels/*.csv": ("gpulab.toolchains", "KERNEL_RESOURCES"),
    "build/timing_pitfalls.csv": ("gpulab.native.timing_pitfalls", "PITFALLS"),
    "env/tools.csv": ("gpulab.env.capture", "TOOLS"),
    "env/runtime_stack.csv": ("gpulab.env.runtime_stack", "RUNTIME_STACK"),
    "llm/*__*.csv": ("gpulab.llm.bench", "LLM"),
    "llm/kernels/*__*.csv": ("gpulab.llm.profile", "LLM_KERNELS"),
    "mlp/summary.csv": ("gpulab.mlp.profile", "MLP_SUMMARY"),
    "mlp/kernels.csv": ("gpulab.mlp.profile", "MLP_KERNELS"),
    "mlp/ops.csv": ("gpulab.mlp.profile", "MLP_OPS"),
    "tune/fast.csv": ("gpulab.llm.tune", "TUNE_FAST"),
    "tune/triton.csv": ("gpulab.bench.tune", "TUNE_TRITON"),
    "tune/triton/*.csv": ("gpulab.bench.tune", "TUNE_TRITON"),
}


def declared_tables() -> dict[str, dict[str, str]]:
    """Every table's columns as its schema declares them, those added later aside (older tables lack them)."""
    import importlib

    from gpulab.core.tables import LATER_COLUMNS

    out = {}
    for pattern, (module, name) in SCHEMAS.items():
        schema = getattr(importlib.import_module(module), name)
        out[pattern] = {c.name: c.kind for c in schema.all_columns if c.name not in LATER_COLUMNS}
    return out


def test_the_tables_the_report_knows_are_the_declared_schemas():
    import yaml

    from gpulab.core.tables import TABLES, declared_columns

    assert set(SCHEMAS) == set(TABLES)
    expected = declared_tables()
    assert {p: declared_columns(p) for p in TABLES} == expected, (
        "src/gpulab/schemas/tables.yaml drifted from the table schemas; write it again with:\n"
        + yaml.safe_dump(expected, sort_keys=False))


def test_every_declared_table_path_is_one_the_report_reads():
    import importlib
    import re as regex

    from gpulab.core.tables import TABLES, matches

    for module, name in set(SCHEMAS.values()):
        schema = getattr(importlib.import_module(module), name)
        if schema.path:
            glob = regex.sub(r"\{[^}]*\}", "*", schema.path)
            assert any(matches(glob.replace("*__*", "x__y").replace("*", "x"), p) for p in TABLES), schema.path
