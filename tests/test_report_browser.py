"""The report in a real browser: headless Chromium driven by Playwright.

Each rendered report must load with no console errors and no network requests, show every section
heading its contents list, decode every image, fit the window's width and expand its collapsed
tables when printed. Screenshots and PDF prints are kept under ``reports/browser/`` (CI artifacts;
look at them). Needs Debian's ``chromium``: without one the tests skip with the reason, unless
GPULAB_REQUIRE_BROWSER=1 (CI) makes a missing browser a failure.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from report_fixtures import CONFIG, FIXTURE_RESULTS, FIXTURES, SYNTHETIC_TARGET, comparison_report, two_target_report

from gpulab.core.ops import OPS
from gpulab.report.browser import MAX_SCREENSHOT_HEIGHT, BrowserUnavailable, check_page, find_chromium
from gpulab.report.example import assemble, render_example
from gpulab.report.findings import OWN_CEILING
from gpulab.report.render import discover_sections, render_report
from gpulab.workflow.config import validate_config

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).resolve().parent.parent / "reports" / "browser"


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    try:
        return find_chromium()
    except BrowserUnavailable as exc:
        if os.environ.get("GPULAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{exc} (GPULAB_REQUIRE_BROWSER=1)")
        pytest.skip(str(exc))


def _check(html: Path, name: str, expected: list[str]):
    check = check_page(html, screenshot=ARTIFACTS / f"{name}.png", pdf=ARTIFACTS / f"{name}.pdf",
                       expected_headings=expected)
    assert check.problems() == [], "\n".join(check.problems())
    assert check.headings == expected
    screenshot = Image.open(io.BytesIO(check.screenshot.read_bytes()))
    assert screenshot.width == 1280 and screenshot.height == min(check.height, MAX_SCREENSHOT_HEIGHT)
    assert check.pdf_pages >= 2
    return check


@pytest.mark.slow
def test_two_target_report_passes_in_the_browser():
    rendered = two_target_report()
    expected = [s["title"] for s in rendered.sections]
    # The fixture holds every step's artifacts: every section there is renders (only the run comparison
    # needs a baseline, and the trends kept runs, which recorded results do not carry).
    assert [s["id"] for s in rendered.sections] == [m.ID for m in discover_sections()
                                                    if m.ID not in ("changes", "history")]
    check = _check(rendered.path, "two-targets", expected)
    html = rendered.path.read_text()
    assert len(check.images) == html.count("<img ") >= 10
    assert all(image["width"] > 100 and image["height"] > 50 for image in check.images)
    assert SYNTHETIC_TARGET in html


@pytest.mark.slow
def test_single_target_report_passes_and_has_no_cross_target_section(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "cpu").symlink_to(FIXTURE_RESULTS / "cpu", target_is_directory=True)
    rendered = render_report(results, tmp_path / "report.html", CONFIG, "pytest")
    expected = [s["title"] for s in rendered.sections]
    assert "Comparison across targets" not in expected
    _check(rendered.path, "single-target", expected)


@pytest.mark.slow
def test_comparison_report_passes_in_the_browser():
    rendered, _ = comparison_report()
    expected = [s["title"] for s in rendered.sections]
    assert [s["id"] for s in rendered.sections] == [m.ID for m in discover_sections()
                                                    if m.ID not in ("across-targets", "history")]
    _check(rendered.path, "compare", expected)


def test_the_check_catches_what_a_reader_would_stumble_over(fixtures, tmp_path):
    check = check_page(fixtures / "report/broken_page.html", screenshot=tmp_path / "broken.png")
    problems = "\n".join(check.problems())
    assert "console error: fixture console error" in problems
    assert "ReferenceError" in problems
    assert "network request: http://127.0.0.1:9/remote.png" in problems
    assert "image 0 (not a png) does not decode" in problems
    assert "'Missing' points nowhere" in problems
    assert "'Missing' listed in the contents is not on the page" in problems
    assert check.headings == ["Present"]


# ------------------------------------------------------------------------------------ the first screen

# The recorded GPU run's page must fit this height at 1280 px (details folded); a page of several targets this
# much per target.
MAX_HEIGHT_PER_TARGET = 12000


@functools.cache
def recorded_pages() -> dict[str, Path]:
    """The example report (recorded H100 and CPU runs) and the recorded H100 run alone, rendered once."""
    root = Path(tempfile.mkdtemp(prefix="gpulab-first-screen-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    example = render_example(FIXTURES, root / "example", validate_config({}), "pytest (example)").path
    results = assemble(FIXTURES, root / "h100" / "results")
    shutil.rmtree(results / "cpu")
    h100 = render_report(results, root / "h100" / "report.html", CONFIG, "pytest (recorded H100 run)").path
    # The same run changed by the test, so that goals are missed and a fastest row set its own ceiling.
    changed = root / "h100-changed" / "results"
    shutil.copytree(results, changed)
    gelu = pd.read_csv(changed / "h100/bench/gelu.csv")
    slow = (gelu["impl"] == "triton") & (gelu["tensor_bytes"] >= 2**28)
    gelu.loc[slow, "pct_of_ceiling"] *= 0.9
    best = gelu["gbps"].idxmax()
    gelu.loc[best, ["ceiling_method", "pct_of_ceiling"]] = [f"gelu {gelu.loc[best, 'impl']} {OWN_CEILING}", 100.0]
    gelu.to_csv(changed / "h100/bench/gelu.csv", index=False)
    missed = render_report(changed, changed.parent / "report.html", CONFIG, "pytest (changed H100 run)").path
    return {"example": example, "h100": h100, "h100-changed": missed}


def _goal_counts(results: Path) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(target, op, dtype) -> (met, missed), straight from the bench CSVs and the ops' goals: the goal cells are
    the triton and cpp_ext rows at the goal's shapes or sizes; met at the goal's % of the ceiling and no more
    than 3% slower than the best of native and torch_compile in the cell."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for path in sorted(results.glob("*/bench/*.csv")):
        op = path.stem
        if op not in OPS or OPS[op].goal is None or not (path.parent.parent / "env/env.json").is_file():
            continue
        if not json.loads((path.parent.parent / "env/env.json").read_text())["device"].get("gpu_available"):
            continue
        goal, rows = OPS[op].goal, pd.read_csv(path, dtype={"size": str})
        ok = rows[rows["status"] == "ok"]
        best = ok[ok["impl"].isin(["native", "torch_compile"])].groupby(["size", "dtype"])["median_ms"].min()
        for r in ok[ok["impl"].isin(["triton", "cpp_ext"])].itertuples():
            at_goal = (r.size in goal.shapes) if goal.shapes else r.tensor_bytes >= goal.min_bytes
            if not at_goal or (goal.dtypes and r.dtype not in goal.dtypes):
                continue
            met = r.pct_of_ceiling >= goal.pct and r.median_ms <= 1.03 * best[(r.size, r.dtype)]
            counts.setdefault((r.target, op, r.dtype), [0, 0])[0 if met else 1] += 1
    return {key: (met, missed) for key, (met, missed) in counts.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["example", "h100", "h100-changed"])
def test_the_first_screen_gives_the_verdict_and_every_link_on_it_resolves(name):
    html = recorded_pages()[name]
    check = check_page(html, screenshot=ARTIFACTS / f"first-{name}.png", pdf=ARTIFACTS / f"first-{name}.pdf",
                       first_screen=ARTIFACTS / f"first-{name}-1280x800.png")
    # Includes: every first-screen link resolves, no table runs past its box on screen or printed.
    assert check.problems() == [], "\n".join(check.problems())
    targets = sorted(p.name for p in (html.parent / "results").iterdir())
    assert check.height <= MAX_HEIGHT_PER_TARGET * len(targets), f"{check.height} px tall"
    on_screen = [link["href"] for link in check.first_links]
    assert any(h.startswith("#fastest-") for h in on_screen) and "#method-ceilings" in on_screen
    assert any(h.startswith("results/h100/") for h in on_screen), on_screen  # a log or table of the run

    # The scoreboard agrees with the CSVs, cell by cell.
    shown = {(m["target"], m["op"], m["dtype"]): (int(m["met"]), int(m["missed"]))
             for m in check.marked if m["check"] == "goal" and int(m["met"]) + int(m["missed"])}
    assert shown == _goal_counts(html.parent / "results") != {}
    misses = [m for m in check.marked if m["check"] == "miss"]
    assert len(misses) == sum(missed for _, missed in shown.values()) and (misses != []) == (name == "h100-changed")

    # No verdict reads a percentage of a ceiling the row set itself.
    heads = [m for m in check.marked if m["check"] == "headline"]
    assert {m["target"] for m in heads} == set(targets)
    for head in heads:
        rows = pd.read_csv(html.parent / "results" / head["target"] / "bench" / f"{head['op']}.csv")
        best = rows[rows["status"] == "ok"].sort_values("gbps").iloc[-1]
        own = best["ceiling_method"] == f"{head['op']} {best['impl']} (fastest row; above every method)"
        assert head["own"] == str(own).lower()
        assert f"{best['gbps']:,.0f}" in head["text"]
        if own:
            assert "fastest measured; ceiling methods reached" in head["text"]
            assert re.search(r"\b100(\.0+)?% of", head["text"]) is None, head["text"]
    assert any(h["own"] == "true" for h in heads) == (name == "h100-changed")
