"""Open a report in headless Chromium and check it the way a reader's browser sees it.

Chromium is driven through the DevTools protocol (its ``--remote-debugging-port``) with a small
websocket client, so the check sees what a user's browser would: console errors and uncaught
exceptions, every network request the page makes (a self-contained report makes none besides
loading itself and its ``data:`` images), whether every image really decodes, whether every section
heading of the table of contents is on the page, whether the page overflows sideways, and whether
the collapsed tables open up when printed. It keeps a full-page screenshot and a PDF print.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The flags the project's CI prescribes for a quiet, sandbox-less, offline browser.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run")
VIEWPORT = (1280, 900)
MAX_SCREENSHOT_HEIGHT = 40000  # px; longer pages are cut (and said so) to keep the PNG a sane size


class BrowserUnavailable(RuntimeError):
    """No Chromium binary, or it did not start."""


class DevToolsError(RuntimeError):
    """A DevTools protocol call failed."""


def find_chromium() -> str:
    for name in (os.environ.get("GPULAB_CHROMIUM", ""), *CHROMIUM_NAMES):
        if name and (path := shutil.which(name)):
            return path
    raise BrowserUnavailable(
        "no Chromium found (tried " + ", ".join(CHROMIUM_NAMES) + "); install it with "
        "`apt-get install chromium` or point GPULAB_CHROMIUM at one")


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
  const external = [...document.querySelectorAll("[src], link[href], object[data], iframe")]
    .map(e => e.getAttribute("src") || e.getAttribute("href") || e.getAttribute("data") || "")
    .filter(u => !u.startsWith("data:"));
  return {
    title: document.title,
    images, sections, toc,
    duplicate_ids: [...duplicates],
    external,
    scripts: document.scripts.length,
    scroll_width: document.documentElement.scrollWidth,
    viewport_width: window.innerWidth,
    height: document.documentElement.scrollHeight,
  };
})()
"""

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
  return {details: document.querySelectorAll("details").length, hidden};
})()
"""


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
        if self.pdf is not None and self.pdf_pages < 1:
            out.append("printing to PDF produced no pages")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


class _DevTools:
    """Minimal DevTools-protocol connection over one websocket: calls by id, events buffered in order."""

    def __init__(self, ws_url: str, timeout_s: float) -> None:
        import websocket  # websocket-client, a dev dependency: only the browser check needs it

        self._ws = websocket.create_connection(ws_url, timeout=timeout_s, suppress_origin=True)
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise DevToolsError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for message in self.events:
            if message["method"] == event:
                return message
        while time.monotonic() < deadline:
            message = json.loads(self._ws.recv())
            if "method" in message:
                self.events.append(message)
                if message["method"] == event:
                    return message
        raise DevToolsError(f"timed out after {timeout_s:g} s waiting for {event}")

    def close(self) -> None:
        self._ws.close()


def _launch(chromium: str, profile: Path, timeout_s: float) -> tuple[subprocess.Popen[bytes], int]:
    log = open(profile / "chromium.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "--hide-scrollbars", "--mute-audio", "--no-default-browser-check",
         f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "about:blank"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (profile / "chromium.log").read_text(errors="replace")[-800:]
            raise BrowserUnavailable(f"{chromium} exited with status {proc.returncode}:\n{tail}")
        if port_file.exists():
            lines = port_file.read_text().split()
            if lines and lines[0].isdigit():
                return proc, int(lines[0])
        time.sleep(0.05)
    _stop(proc)
    raise BrowserUnavailable(f"{chromium} did not open its DevTools port within {timeout_s:g} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the browser we started and its child processes (its own process group), nothing else."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _page_socket(port: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as response:
            pages = [t for t in json.load(response) if t.get("type") == "page"]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.05)
    raise BrowserUnavailable("Chromium opened no page")


def _console_text(event: dict[str, Any]) -> str:
    params = event["params"]
    if event["method"] == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return details.get("exception", {}).get("description") or details.get("text", "uncaught exception")
    if event["method"] == "Log.entryAdded":
        entry = params["entry"]
        return f"{entry.get('text', '')} {entry.get('url', '')}".strip()
    return " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))


def check_page(
    html: str | Path,
    *,
    screenshot: str | Path | None = None,
    pdf: str | Path | None = None,
    expected_headings: Sequence[str] = (),
    timeout_s: float = 60,
) -> PageCheck:
    """Load ``html`` in headless Chromium and record what a reader's browser would show and complain about."""
    html = Path(html).resolve()
    if not html.is_file():
        raise FileNotFoundError(f"{html}: no such report")
    url = html.as_uri()
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="gpulab-chromium-") as tmp:
        proc, port = _launch(chromium, Path(tmp), timeout_s)
        try:
            tools = _DevTools(_page_socket(port, timeout_s), timeout_s)
            try:
                return _inspect(tools, url, screenshot, pdf, list(expected_headings), timeout_s)
            finally:
                # The browser may already be gone; _stop makes sure either way.
                with contextlib.suppress(Exception):
                    tools.call("Browser.close")
                tools.close()
        finally:
            _stop(proc)


def _record_events(check: PageCheck, events: list[dict[str, Any]], url: str) -> None:
    """The page's requests other than itself, its console errors and warnings, from the DevTools events."""
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Network.requestWillBeSent":
            request_url = params["request"]["url"]
            if request_url != url and not request_url.startswith("data:"):
                check.requests.append(request_url)
            continue
        if method == "Runtime.exceptionThrown":
            level = "error"
        elif method == "Runtime.consoleAPICalled":
            level = {"error": "error", "assert": "error", "warning": "warning"}.get(params.get("type"))
        elif method == "Log.entryAdded":
            level = params["entry"].get("level")
        else:
            continue
        if level == "error":
            check.console_errors.append(_console_text(event))
        elif level == "warning":
            check.console_warnings.append(_console_text(event))


def _inspect(tools: _DevTools, url: str, screenshot: str | Path | None, pdf: str | Path | None,
             expected: list[str], timeout_s: float) -> PageCheck:
    for domain in ("Page", "Runtime", "Log", "Network"):
        tools.call(f"{domain}.enable")
    width, height = VIEWPORT
    tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    tools.events.clear()  # about:blank's own events are not the report's
    tools.call("Page.navigate", url=url)
    tools.wait_for("Page.loadEventFired", timeout_s)
    result = tools.call("Runtime.evaluate", expression=PAGE_CHECK_JS, awaitPromise=True, returnByValue=True)
    if "exceptionDetails" in result:
        raise DevToolsError(f"page check script failed: {result['exceptionDetails'].get('text')}")
    page = result["result"]["value"]
    check = PageCheck(url=url, title=page["title"], sections=page["sections"], toc=page["toc"], images=page["images"],
                      duplicate_ids=page["duplicate_ids"], external=page["external"],
                      scroll_width=page["scroll_width"], viewport_width=page["viewport_width"],
                      height=page["height"], expected_headings=expected)

    if screenshot is not None:
        full = min(int(page["height"]), MAX_SCREENSHOT_HEIGHT)
        tools.call("Emulation.setDeviceMetricsOverride", width=width, height=full, deviceScaleFactor=1, mobile=False)
        shot = tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": full, "scale": 1})
        path = Path(screenshot)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        check.screenshot, check.screenshot_truncated = path, page["height"] > MAX_SCREENSHOT_HEIGHT
        tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    tools.call("Emulation.setEmulatedMedia", media="print")
    printed = tools.call("Runtime.evaluate", expression=PRINT_CHECK_JS, returnByValue=True)["result"]["value"]
    check.print_hidden = printed["hidden"]
    tools.call("Emulation.setEmulatedMedia", media="")
    if pdf is not None:
        data = tools.call("Page.printToPDF", printBackground=True, preferCSSPageSize=True)["data"]
        blob = base64.b64decode(data)
        path = Path(pdf)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        check.pdf = path
        check.pdf_pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", blob))

    # Give late console messages (e.g. an image failing after load) a moment to arrive.
    tools.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 100))", awaitPromise=True)
    _record_events(check, tools.events, url)
    return check
