"""``gpulab report --bundle``: the page and every file it links to, in one zip archive that works anywhere.

The page's relative links (logs, tables, traces) point into the results directory it was rendered from. In the
archive the page is ``report.html`` at the top and each linked file keeps its path under ``results/``, the links
rewritten to match, so the page unpacked on another machine still opens them. Only files inside the results
directory are taken; a link to anything else is left as it was and named in :attr:`Bundle.outside`.
"""

from __future__ import annotations

import html
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import quote, unquote

# A relative link: no scheme (data:, https:, file:), not an in-page anchor, not an absolute path.
HREF = re.compile(r'href="(?![#/])(?![a-zA-Z][a-zA-Z0-9+.-]*:)([^"]+)"')
PAGE_NAME = "report.html"
RESULTS_NAME = "results"


@dataclass(frozen=True)
class Bundle:
    path: Path
    files: int
    size_bytes: int
    outside: list[str] = field(default_factory=list)


def _members(target: Path, root: Path) -> dict[str, Path]:
    """Archive name -> file for a linked file or every file of a linked directory, all inside ``root``."""
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    return {(PurePosixPath(RESULTS_NAME) / f.relative_to(root).as_posix()).as_posix(): f
            for f in files if f.resolve().is_relative_to(root)}


def bundled_page(page_html: str, page_dir: Path, results_dir: Path) -> tuple[str, dict[str, Path], list[str]]:
    """The page with its links into ``results_dir`` rewritten to ``results/...``, the files they need, and the
    links left as they were (outside the results directory, or to nothing)."""
    root, members, outside = results_dir.resolve(), {}, []

    def rewrite(match: re.Match[str]) -> str:
        href = html.unescape(match.group(1))
        target = (page_dir / unquote(href.split("#", 1)[0])).resolve()
        if not target.exists() or not target.is_relative_to(root):
            outside.append(href)
            return match.group(0)
        members.update(_members(target, root))
        name = (PurePosixPath(RESULTS_NAME) / target.relative_to(root).as_posix()).as_posix()
        return f'href="{html.escape(quote(name) + ("/" if target.is_dir() else ""))}"'

    return HREF.sub(rewrite, page_html), members, sorted(set(outside))


def write_bundle(page: Path, results_dir: Path, archive: Path) -> Bundle:
    """Write ``archive`` (a zip) holding ``page`` as report.html and the results files it links to."""
    text, members, outside = bundled_page(page.read_text(encoding="utf-8"), page.resolve().parent, results_dir)
    archive.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".tmp")
    os.close(handle)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(PAGE_NAME, text)
            for name, path in sorted(members.items()):
                zf.write(path, name)
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Bundle(archive, len(members) + 1, archive.stat().st_size, outside)
