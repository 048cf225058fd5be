"""Malformed result trees, generated, through ``gpulab report`` and ``gpulab compare``: each ends in time, no
section fails, nothing outside the tree is read (a marker planted beside it never shows), every problem is listed."""

from __future__ import annotations

import contextlib
import html
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/fixtures/report/results/cpu"
MARKER = "fuzz marker planted outside the results"
LIMIT_S = 30
# The part of the fixture run each family of trees starts from: (file, rows kept), env/env.json always.
FAMILIES = {
    "bench": {"bench/gelu.csv": 4},
    "llm": {"llm/tiny__fast.csv": 3, "llm/tiny__fast.json": None},
    "mlp": {"mlp/summary.csv": 3, "mlp/kernels.csv": 12},
    "env": {"env/tools.csv": 4},
}
NUMBER_CELLS = {"bench": "median_ms", "llm": "tok_s", "mlp": "median_ms", "env": "exit_status"}
PATH_CELLS = {"llm": "text_file", "mlp": "trace", "env": "raw_file"}


@dataclass(frozen=True)
class Tree:
    """One generated results root: what was done to it, and the entry the page must list (None: nothing to)."""

    name: str
    family: str
    root: Path
    expect: str | None


def _base(root: Path, family: str, target: str = "cpu") -> Path:
    """A small clean run of one family: env.json and the first rows of its tables."""
    base = root / target
    (base / "env").mkdir(parents=True)
    shutil.copy(FIXTURE / "env/env.json", base / "env/env.json")
    for rel, rows in FAMILIES[family].items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        text = (FIXTURE / rel).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        (base / rel).write_text(text if rows is None else "".join(lines[:rows]), encoding="utf-8")
    return base


def _set_cell(path: Path, column: str, value: str, row: int = 1) -> None:
    """Replace one cell of a CSV as text (the files are simple: no quoted commas in the columns touched)."""
    import csv

    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    rows[row][rows[0].index(column)] = value
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _table(family: str) -> str:
    return next(rel for rel in FAMILIES[family] if rel.endswith(".csv"))


def _mutations(family: str, rng: random.Random, outside: Path) -> list[tuple[str, object]]:
    """(name, function of the target directory returning the entry the page must list, or None)."""
    table = _table(family)
    size = len((FIXTURE / table).read_text(encoding="utf-8").splitlines(keepends=True)[0])

    def cut(at: int):
        def apply(base: Path) -> str | None:
            data = (base / table).read_bytes()
            (base / table).write_bytes(data[:at])
            whole = at >= len(data) or (data[:at].endswith(b"\n") and at >= size)  # fewer rows, all whole
            return None if whole else f"{base.name}/{table}"
        return apply

    def cell(value: str, listed: bool):
        def apply(base: Path) -> str | None:
            _set_cell(base / table, NUMBER_CELLS[family], value, row=rng.randint(1, 2))
            return f"{base.name}/{table}" if listed else None
        return apply

    def replace(how: str):
        def apply(base: Path) -> str | None:
            path = base / table
            path.unlink()
            if how == "fifo":
                os.mkfifo(path)
            elif how == "zero":
                path.symlink_to("/dev/zero")
            elif how == "out":
                path.symlink_to(outside / "marker.csv")
            elif how == "dir":
                path.mkdir()
                return None
            elif how == "empty":
                path.write_bytes(b"")
            elif how == "huge":
                with open(path, "wb") as fh:
                    fh.write(b"target,status\n")
                    fh.truncate(65 * 2**20)  # sparse: over the 64 MiB limit, written at once
            elif how == "latin1":
                path.write_bytes((FIXTURE / table).read_bytes().replace(b",ok,", b",\xe9\xff,", 1))
            elif how == "garbage":
                path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000))))
                return None  # random bytes may still parse as some table; it must only not crash
            elif how == "quote":
                path.write_bytes(b'target,status\n"cpu,ok\n')
            return f"{base.name}/{table}"
        return apply

    def stray(name: str):
        def apply(base: Path) -> str:
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_text("target,status\ncpu,ok\n", encoding="utf-8")
            return f"{base.name}/{name}"
        return apply

    def link_in(base: Path) -> None:
        (base / "bench").mkdir(exist_ok=True)
        (base / "bench/alias.csv").symlink_to(f"../{table}")
        return None if table.startswith("bench/") else f"{base.name}/bench/alias.csv"

    def aside(rel: str, how: str):
        def apply(base: Path) -> str | None:
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if how == "fifo":
                os.mkfifo(path)
            elif how == "out":
                path.symlink_to(outside / "marker.csv")
            elif how == "zero":
                path.symlink_to("/dev/zero")
            else:
                path.write_bytes(b'[1, 2]\n{"rule_name": \n\xff\n')
                return None  # listed only where a section reads it
            return f"{base.name}/{rel}"
        return apply

    def env(text: str):
        def apply(base: Path) -> str:
            (base / "env/env.json").write_text(text, encoding="utf-8")
            return f"{base.name}/env/env.json"
        return apply

    def env_shape(doc: str):
        def apply(base: Path) -> None:
            (base / "env/env.json").write_text(doc, encoding="utf-8")
            return None
        return apply

    out = [(f"cut{at}", cut(at)) for at in sorted(rng.sample(range(1, size * 3), 6))]
    out += [(f"cell-{v}", cell(v, listed)) for v, listed in
            (("nan", False), ("inf", False), ("-inf", False), ("1e308", False), ("", False), ("abc", True),
             ("12,5", True), ("true", True), ("0x1f", True), ("😀", True))]
    out += [(how, replace(how)) for how in ("fifo", "zero", "out", "dir", "empty", "huge", "latin1", "garbage",
                                             "quote")]
    out += [("stray-top", stray("notes.csv")), ("stray-deep", stray("bench/x/y.csv")),
            ("stray-unicode", stray("bench/ü-ターゲット.txt")), ("link-in", link_in)]
    out += [("env-broken", env("{not json")), ("env-list", env("[1, 2]")), ("env-deep", env("[" * 100000)),
            ("env-out", lambda base: (base / "env/env.json").unlink() or
             (base / "env/env.json").symlink_to(outside / "marker.json") or f"{base.name}/env/env.json"),
            ("env-fifo", lambda base: (base / "env/env.json").unlink() or os.mkfifo(base / "env/env.json")
             or f"{base.name}/env/env.json"),
            ("env-device-text", env_shape('{"device": "gpu", "fingerprint": 3}')),
            ("env-device-null", env_shape('{"device": null, "packages": "x", "versions": [1]}'))]
    if family in ("bench", "mlp"):  # the folders of records beside the tables, once per kind of table is enough
        out += [(f"aside-{how}-{rel.split('/')[0]}", aside(rel, how)) for rel, how in (
            ("benchmarks/env_capture.jsonl", "fifo"), ("benchmarks/bench_cell_gelu__native.jsonl", "garbage"),
            ("device_waits/bench_cell_gelu__native.jsonl", "fifo"), ("history/20260101T000000__abc__def/jobs/a.json",
                                                                      "fifo"),
            ("history/20260101T000000__abc__def/bench/gelu.csv", "out"), ("logs/env_capture.log", "out"),
            ("env/raw/zero.txt", "zero"))]
    if family in PATH_CELLS:
        column = PATH_CELLS[family]
        values = [str(outside / "marker.json"), "../../../outside/marker.json", "../../outside/marker.json",
                  "escape.json", "fifo.json", "../"]

        def path_cell(value: str):
            def apply(base: Path) -> str:
                folder = base / table.split("/")[0]
                (folder / "escape.json").symlink_to(outside / "marker.json")
                os.mkfifo(folder / "fifo.json")
                rows = (base / table).read_text(encoding="utf-8").count("\n") - 1
                for row in range(1, rows + 1):
                    _set_cell(base / table, column, value, row)
                return f"{base.name}/{table}"
            return apply
        out += [(f"path{i}", path_cell(v)) for i, v in enumerate(values)]
    return out


def corpus(root: Path) -> list[Tree]:
    """Every family under every mutation, and every fifth mutation again in a target with a unicode name."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "marker.json").write_text(f'{{"study": {{"response": "{MARKER}"}}, "device": "{MARKER}"}}\n')
    (outside / "marker.csv").write_text(f"target,status,reason\ncpu,failed,{MARKER}\n")
    rng = random.Random(56)
    trees = []
    for family in FAMILIES:
        clean = root / f"clean-{family}"
        _base(clean, family)
        for target, every in (("cpu", 1), ("zielgerät-ü", 5)):
            for name, apply in _mutations(family, rng, outside)[::every]:
                tree = root / f"{family}-{target}-{name}"
                base = _base(tree, family, target)
                trees.append(Tree(f"{family}/{target}/{name}", family, tree, apply(base)))
    return trees


def _listed(page: str) -> str:
    start = page.find("could not be shown")
    return "" if start < 0 else html.unescape(re.sub(r"<[^>]+>", "", page[start:page.index("</div>", start)]))


def _alarm(_signum, _frame):
    raise TimeoutError(f"over {LIMIT_S} s")


def run_tree(tree: Tree) -> dict[str, object]:
    """``gpulab report`` and ``gpulab compare`` (against a clean run of the family) on one tree, in this process."""
    from gpulab.cli import main

    signal.signal(signal.SIGALRM, _alarm)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[os.getpid() % len(cores)]})  # one core each: sections render in this process
    failures, pages = [], {}
    os.chdir(tree.root)
    for command in (["report", str(tree.root), "-o", "report.html"],
                    ["compare", str(tree.root.parent / f"clean-{tree.family}"), str(tree.root), "-o", "compare.html"]):
        err = io.StringIO()
        start = time.monotonic()
        signal.alarm(LIMIT_S)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
                code = main(command)
        except BaseException as exc:  # what the test reports: any exit but a clean one
            code = f"{type(exc).__name__}: {exc}"
        finally:
            signal.alarm(0)
        text = err.getvalue()
        page = Path(command[3 if command[0] == "report" else 4]).read_text(encoding="utf-8", errors="replace") \
            if code in (0, 1) else ""
        pages[command[0]] = page
        if code not in (0, 1) or "Traceback" in text or "could not be rendered" in text:
            failures.append(f"{command[0]}: exit {code}: {text[-1500:]}")
        if MARKER in page or MARKER in text:
            failures.append(f"{command[0]}: the marker outside the tree was read")
        if tree.expect and command[0] == "report" and tree.expect not in _listed(page):
            failures.append(f"{command[0]}: {tree.expect} not listed; listed: {_listed(page)[:600]}")
        if time.monotonic() - start > LIMIT_S:
            failures.append(f"{command[0]}: {time.monotonic() - start:.0f} s")
    return {"tree": tree.name, "failures": failures}


def test_malformed_result_trees_end_in_time_read_nothing_outside_and_list_every_problem(tmp_path):
    trees = corpus(tmp_path)
    assert len(trees) >= 200
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("fork")) as pool:
        outcomes = list(pool.map(run_tree, trees, chunksize=8))
    failed = [f"{o['tree']}: {f}" for o in outcomes for f in o["failures"]]
    assert not failed, f"{len(failed)} failures in {time.monotonic() - start:.0f} s:\n" + "\n".join(failed[:40])


@pytest.mark.parametrize("case", ["bench/cpu/fifo", "llm/cpu/path0", "mlp/zielgerät-ü/aside-out-history"])
def test_the_installed_command_ends_cleanly_on_a_malformed_tree(tmp_path, case):
    tree = next(t for t in corpus(tmp_path) if t.name == case)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "gpulab.cli", "report", str(tree.root), "-o", "report.html"],
                          cwd=tree.root, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    page = (tree.root / "report.html").read_text(encoding="utf-8")
    assert MARKER not in page and tree.expect in _listed(page)
