"""The report in a real browser: headless Chromium driven by Playwright.

Each rendered report must load with no console errors and no network requests, show every section
heading its contents list, decode every image, fit the window's width and expand its collapsed
tables when printed. Screenshots and PDF prints are kept under ``reports/browser/`` (CI artifacts;
look at them). Needs Debian's ``chromium``: without one the tests skip with the reason, unless
GPULAB_REQUIRE_BROWSER=1 (CI) makes a missing browser a failure.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image
from report_fixtures import CONFIG, FIXTURE_RESULTS, SYNTHETIC_TARGET, comparison_report, two_target_report

from gpulab.report.browser import MAX_SCREENSHOT_HEIGHT, BrowserUnavailable, check_page, find_chromium
from gpulab.report.render import discover_sections, render_report

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
