"""Open a report in headless Chromium (the system's, through Playwright) and check it as a reader's browser sees it.

Console errors, network requests (a self-contained page makes none), images that do not decode, contents entries
without their section, a page wider than the window, first-screen links that resolve nowhere, tables that run past
their box on screen or in print, and folded detail that stays hidden in print. Keeps a screenshot and a PDF.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from playwright.sync_api import ConsoleMessage, Page, Request, sync_playwright
from playwright.sync_api import Error as PlaywrightError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Playwright launches headless, without the sandbox, background networking or first-run pages already.
CHROMIUM_FLAGS = ("--disable-gpu",)
VIEWPORT = (1280, 800)  # the first screen: what a reader sees before scrolling
# The printed page's width in CSS px: A4 (210 mm) less the page's 12 mm margins each side, at 96 px per inch.
PRINT_WIDTH = round((210 - 24) / 25.4 * 96)
MAX_SCREENSHOT_HEIGHT = 40000  # px; longer pages are cut (and said so) to keep the PNG a sane size
# Console message types that count as errors and warnings (as the browser's console shows them).
ERROR_TYPES = {"error", "assert"}
WARNING_TYPES = {"warning"}


class BrowserUnavailable(RuntimeError):
    """No Chromium binary, or it did not start."""


def find_chromium() -> str:
    """GPULAB_CHROMIUM (a path or a command name), else the first of CHROMIUM_NAMES on PATH."""
    for name in (os.environ.get("GPULAB_CHROMIUM", ""), *CHROMIUM_NAMES):
        if name and (path := shutil.which(name)):
            return path
    raise BrowserUnavailable("no Chromium found; install chromium (apt-get install chromium) or set GPULAB_CHROMIUM")


# Tables a reader sees whose content runs past their box (sideways, or in print down past a scroll box).
OVERFLOW_JS = r"""
() => [...document.querySelectorAll("table")].map(t => {
  const box = t.closest(".table-wrap") || t.parentElement;
  if (!box.checkVisibility()) return null;
  const print = matchMedia("print").matches;
  const wide = box.scrollWidth - box.clientWidth, tall = box.scrollHeight - box.clientHeight;
  if (wide <= 1 && !(print && tall > 1)) return null;
  const head = (t.querySelector("thead") || t).textContent.replace(/\s+/g, " ").trim().slice(0, 60);
  return `${head} (${wide > 1 ? wide + " px too wide" : tall + " px cut off"})`;
}).filter(x => x)
"""

# Runs in the page after load: everything a reader would stumble over that the DOM can tell.
PAGE_CHECK_JS = r"""
(async () => {
  const images = await Promise.all([...document.images].map(async (img, index) => {
    let error = null;
    try { await img.decode(); } catch (e) { error = String(e); }
    return {index, alt: img.alt, src: (img.getAttribute("src") || "").slice(0, 48),
            width: img.naturalWidth, height: img.naturalHeight, error};
  }));
  const sections = [...document.querySelectorAll("main > section")].map(s => {
    const h = s.querySelector("h2");
    return {id: s.id, heading: h ? h.textContent.trim() : null,
            visible: h ? h.getBoundingClientRect().height > 0 : false};
  });
  const toc = [...document.querySelectorAll("nav.toc a")].map(a => {
    const href = a.getAttribute("href") || "";
    return {href, text: a.textContent.trim(),
            resolves: href.startsWith("#") && document.getElementById(href.slice(1)) !== null};
  });
  const seen = new Set(), duplicates = new Set();
  for (const el of document.querySelectorAll("[id]")) { if (seen.has(el.id)) duplicates.add(el.id); seen.add(el.id); }
  const first_links = [...document.querySelectorAll("a[href]")].filter(a => {
    const r = a.getBoundingClientRect();
    return a.checkVisibility() && r.width > 0 && r.bottom > 0 && r.top < window.innerHeight;
  }).map(a => {
    const href = a.getAttribute("href") || "";
    const inPage = href.startsWith("#");
    return {href, text: a.textContent.trim(),
            resolves: inPage ? document.getElementById(decodeURIComponent(href.slice(1))) !== null : null};
  });
  const marked = [...document.querySelectorAll("[data-check]")].map(
    e => ({...e.dataset, text: e.textContent.replace(/\s+/g, " ").trim()}));
  const external = [...document.querySelectorAll("[src], link[href], object[data], iframe")]
    .map(e => e.getAttribute("src") || e.getAttribute("href") || e.getAttribute("data") || "")
    .filter(u => !u.startsWith("data:"));
  return {
    title: document.title,
    images, sections, toc, first_links, marked, overflowing: (OVERFLOW_JS)(),
    duplicate_ids: [...duplicates],
    external,
    scripts: document.scripts.length,
    scroll_width: document.documentElement.scrollWidth,
    viewport_width: window.innerWidth,
    height: document.documentElement.scrollHeight,
  };
})()
""".replace("OVERFLOW_JS", OVERFLOW_JS)

# Under print media: collapsed tables must be laid out (their content has a height), except the data
# behind a figure, which the printed figure stands for, and full row dumps the page summarises elsewhere.
PRINT_CHECK_JS = r"""
(() => {
  const hidden = [];
  for (const d of document.querySelectorAll("details:not(.figure-data, .raw-data)")) {
    const body = [...d.children].find(c => c.tagName !== "SUMMARY");
    if (body && body.getBoundingClientRect().height === 0) {
      hidden.push((d.querySelector("summary") || {}).textContent || "details");
    }
  }
  return {details: document.querySelectorAll("details").length, hidden, overflowing: (OVERFLOW_JS)()};
})()
""".replace("OVERFLOW_JS", OVERFLOW_JS)


@dataclass
class PageCheck:
    """What the browser saw; :meth:`problems` lists everything that should fail a check."""

    url: str
    title: str = ""
    console_errors: list[str] = field(default_factory=list)
    console_warnings: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    sections: list[dict[str, Any]] = field(default_factory=list)
    toc: list[dict[str, Any]] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    scroll_width: int = 0
    viewport_width: int = 0
    height: int = 0
    print_hidden: list[str] = field(default_factory=list)
    first_links: list[dict[str, Any]] = field(default_factory=list)  # first-screen links, whether each resolves
    marked: list[dict[str, Any]] = field(default_factory=list)  # elements marked data-check, with their data and text
    overflowing: list[str] = field(default_factory=list)  # tables running past their box on screen
    print_overflowing: list[str] = field(default_factory=list)  # ... and printed, at the page's width
    first_screen: Path | None = None
    screenshot: Path | None = None
    screenshot_truncated: bool = False
    pdf: Path | None = None
    pdf_pages: int = 0
    expected_headings: list[str] = field(default_factory=list)

    @property
    def headings(self) -> list[str]:
        return [s["heading"] for s in self.sections if s.get("heading")]

    def problems(self) -> list[str]:
        out = [f"console error: {m}" for m in self.console_errors]
        out += [f"network request: {u}" for u in self.requests]
        out += [f"resource outside the file: {u}" for u in self.external]
        for image in self.images:
            if image.get("error") or not image.get("width") or not image.get("height"):
                out.append(f"image {image['index']} ({image.get('alt') or image.get('src')}) does not decode: "
                           f"{image.get('error') or 'zero size'}")
        for entry in self.toc:
            if not entry["resolves"]:
                out.append(f"table of contents entry {entry['text']!r} points nowhere ({entry['href']})")
        toc_titles = [e["text"] for e in self.toc]
        for title in toc_titles:
            if title not in self.headings:
                out.append(f"section heading {title!r} listed in the contents is not on the page")
        for title in self.expected_headings:
            if title not in self.headings:
                out.append(f"expected section heading {title!r} is missing")
        for section in self.sections:
            if not section.get("heading"):
                out.append(f"section {section.get('id')!r} has no heading")
            elif not section.get("visible"):
                out.append(f"section heading {section['heading']!r} is not visible")
        out += [f"duplicate element id {i!r}" for i in self.duplicate_ids]
        if self.scroll_width > self.viewport_width + 1:
            out.append(f"page is wider than the window ({self.scroll_width} px > {self.viewport_width} px)")
        out += [f"collapsed content stays hidden when printed: {s.strip()}" for s in self.print_hidden]
        out += [f"first-screen link {link['text']!r} resolves nowhere ({link['href']})" for link in self.first_links
                if link["resolves"] is False]
        out += [f"table runs past its box: {t}" for t in self.overflowing]
        out += [f"table runs past its box when printed: {t}" for t in self.print_overflowing]
        if self.pdf is not None and self.pdf_pages < 1:
            out.append("printing to PDF produced no pages")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


def check_page(
    html: str | Path,
    *,
    screenshot: str | Path | None = None,
    pdf: str | Path | None = None,
    first_screen: str | Path | None = None,
    expected_headings: Sequence[str] = (),
    timeout_s: float = 60,
) -> PageCheck:
    """Load ``html`` in headless Chromium and record what a reader's browser would show and complain about."""
    html = Path(html).resolve()
    if not html.is_file():
        raise FileNotFoundError(f"{html}: no such report")
    chromium = find_chromium()
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS),
                                                 timeout=timeout_s * 1000)
        except PlaywrightError as exc:
            raise BrowserUnavailable(f"{chromium} did not start: {exc.message.splitlines()[0]}") from exc
        try:
            page = browser.new_page(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
            page.set_default_timeout(timeout_s * 1000)
            check = _inspect(page, html.as_uri(), screenshot, pdf, list(expected_headings), first_screen)
        finally:
            browser.close()
    _resolve_files(check, html.parent)
    return check


def _resolve_files(check: PageCheck, folder: Path) -> None:
    """Whether each first-screen link to a file names one that exists (relative to the page's folder)."""
    for link in check.first_links:
        href = link["href"]
        if link["resolves"] is None and not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", href):
            link["resolves"] = (folder / unquote(href.split("#", 1)[0])).exists()
        elif link["resolves"] is None:
            link["resolves"] = True  # a web address: not fetched (the page must work offline), not judged here


def _listen(page: Page, check: PageCheck) -> None:
    """Record the page's console errors and warnings, uncaught exceptions and requests other than itself."""

    def console(message: ConsoleMessage) -> None:
        source = message.location.get("url", "")
        text = message.text if source in ("", check.url) else f"{message.text} {source}"
        if message.type in ERROR_TYPES:
            check.console_errors.append(text)
        elif message.type in WARNING_TYPES:
            check.console_warnings.append(text)

    def request(request: Request) -> None:
        if request.url != check.url and not request.url.startswith("data:"):
            check.requests.append(request.url)

    page.on("console", console)
    page.on("pageerror", lambda error: check.console_errors.append(f"{error.name}: {error.message}"))
    page.on("request", request)


def _write(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _inspect(page: Page, url: str, screenshot: str | Path | None, pdf: str | Path | None,
             expected: list[str], first_screen: str | Path | None = None) -> PageCheck:
    check = PageCheck(url=url, expected_headings=expected)
    _listen(page, check)
    page.goto(url, wait_until="load")
    found = page.evaluate(PAGE_CHECK_JS)
    for name in ("title", "sections", "toc", "images", "duplicate_ids", "external", "scroll_width",
                 "viewport_width", "height", "first_links", "marked", "overflowing"):
        setattr(check, name, found[name])
    if first_screen is not None:
        check.first_screen = _write(first_screen, page.screenshot())

    if screenshot is not None:
        width, full = VIEWPORT[0], min(int(check.height), MAX_SCREENSHOT_HEIGHT)
        page.set_viewport_size({"width": width, "height": full})
        shot = page.screenshot(clip={"x": 0, "y": 0, "width": width, "height": full})
        check.screenshot, check.screenshot_truncated = _write(screenshot, shot), check.height > MAX_SCREENSHOT_HEIGHT
        page.set_viewport_size({"width": VIEWPORT[0], "height": VIEWPORT[1]})

    # Printed, at the printed page's width: collapsed detail must open and no table may run past its box.
    page.set_viewport_size({"width": PRINT_WIDTH, "height": VIEWPORT[1]})
    page.emulate_media(media="print")
    printed = page.evaluate(PRINT_CHECK_JS)
    check.print_hidden, check.print_overflowing = printed["hidden"], printed["overflowing"]
    page.emulate_media(media="null")
    page.set_viewport_size({"width": VIEWPORT[0], "height": VIEWPORT[1]})
    if pdf is not None:
        blob = page.pdf(print_background=True, prefer_css_page_size=True)
        check.pdf = _write(pdf, blob)
        check.pdf_pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", blob))

    # Give late console messages (e.g. an image failing after load) a moment to arrive.
    page.wait_for_timeout(100)
    return check
