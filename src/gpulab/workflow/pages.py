"""The last good report page, kept beside it as a hard link (which takes no space on a full disk).

Snakemake removes a job's output before the job runs, so a render that fails (a full disk) would leave no page:
each run keeps the page it finds (:func:`keep`); a failed render puts it back (:func:`put_back`), marked for the
next run to render again."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpulab.core.history import STALE_MTIME


def kept(page: str | Path) -> Path:
    page = Path(page)
    return page.with_name(f".{page.name}.last-good")


def _marker(page: str | Path) -> Path:
    page = Path(page)
    return page.with_name(f".{page.name}.put-back")


def keep(page: str | Path) -> None:
    """Keep the page in place (always a whole one: it is written beside and moved over) as the last good one."""
    link = kept(page)
    tmp = link.with_name(link.name + ".tmp")
    # No page yet, or a filesystem without hard links: there is nothing to keep.
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
        os.link(page, tmp)
        os.replace(tmp, link)


def put_back(page: str | Path) -> str | None:
    """Where the page is missing, link the last good one back, dated :data:`STALE_MTIME`; the line for the user,
    None where there is nothing to do. Never raises."""
    page, link = Path(page), kept(page)
    if page.exists() or not link.is_file():
        return None
    try:
        _marker(page).touch()  # first: it makes the next run render the page again (:func:`stamp`)
        os.link(link, page)
        os.utime(page, (STALE_MTIME, STALE_MTIME))
    except OSError as exc:
        return f"{page}: its render did not complete and the last good page could not be put back ({exc}); it is {link}"
    return f"{page}: its render did not complete; the last good page is back in place and the next run renders it again"


def stamp(page: str | Path) -> str:
    """A ``params:`` value of the report's rule: it changes each time a page is put back and stays after the
    next render, so Snakemake renders a put-back page once more."""
    try:
        return str(_marker(page).stat().st_mtime_ns)
    except OSError:
        return ""
