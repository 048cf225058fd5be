"""Render ``reports/report.html``: discover the section modules, build each, fill the templates.

A section is one module in ``gpulab.report.sections`` (``ORDER``, ``ID``, ``TITLE``, ``TEMPLATE``,
``build(ctx)``) plus one template in ``templates/``. ``build`` returns the template's variables, or
None when the results hold nothing for it. Templates import the shared macros
(``{% from "macros.html.j2" import figure, data_table %}``) and figures come from
:mod:`gpulab.report.plots`, so every section looks the same.

With a ``baseline`` results directory the same report is rendered for the new results, with a
section of per-cell deltas against the baseline (``gpulab compare``).
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import math
import os
import pkgutil
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pandas as pd
import yaml
from markupsafe import Markup

from gpulab.core.parallel import run_all
from gpulab.core.tables import write_atomic
from gpulab.env.capture import git_state
from gpulab.report import sections as sections_pkg
from gpulab.report.findings import ABOVE_PCT
from gpulab.report.formats import platforms_title
from gpulab.report.plots import apply_style
from gpulab.report.results import MAX_TABLE_BYTES, Problem, ResultsIndex

TEMPLATES = Path(__file__).resolve().parent / "templates"
SIZE_BUDGET_BYTES = 5 * 2**20
# Columns holding a percentage of a measured ceiling: a cell above 100 is drawn as a flagged one.
PCT_COLUMNS = ("% of ceiling", "pct_of_ceiling", "% of read-only roofline")
log = logging.getLogger(__name__)


class ReportError(RuntimeError):
    """The report cannot be rendered as asked (missing results, a section failing in strict mode)."""


@dataclass
class ReportContext:
    results: ResultsIndex
    output: Path
    config: dict[str, Any]
    command: str
    baseline: ResultsIndex | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def link(self, path: str | Path) -> str:
        """Relative link from the report to a file (logs, traces), so the page works when copied with results."""
        return Path(os.path.relpath(Path(path).resolve(), self.output.resolve().parent)).as_posix()

    @property
    def targets(self) -> list[str]:
        return self.results.targets

    @property
    def multi_target(self) -> bool:
        return len(self.results.targets) > 1

    @cached_property
    def devices(self) -> dict[str, dict[str, Any]]:
        return {t: (self.results.env(t) or {}).get("device", {}) for t in self.results.targets}

    @cached_property
    def target_labels(self) -> dict[str, str]:
        """Panel titles: the target and its device, e.g. ``h100 · NVIDIA H100 80GB HBM3 (cuda)``."""
        labels = {}
        for target, device in self.devices.items():
            name = device.get("name")
            backend = device.get("backend")
            labels[target] = f"{target} · {name} ({backend})" if name and backend else target
        return labels

    @property
    def baseline_target(self) -> str | None:
        """The target other targets are compared against: ``report.baseline_target``, else this invocation's own
        (``target``), else the first configured one, never merely the first by name when one of those has results:
        a target copied in from elsewhere must not become the baseline by sorting first."""
        targets = self.results.targets
        wanted = [self.config.get("report", {}).get("baseline_target"), self.config.get("target"),
                  *sorted(self.config.get("targets") or {})]
        return next((t for t in wanted if t in targets), targets[0] if targets else None)


def discover_sections() -> list[ModuleType]:
    modules = [importlib.import_module(f"{sections_pkg.__name__}.{m.name}")
               for m in pkgutil.iter_modules(sections_pkg.__path__)]
    return sorted((m for m in modules if hasattr(m, "build")), key=lambda m: m.ORDER)


def format_number(value: Any, fmt: str | None = None) -> str:
    """Numbers as a reader wants them: thousands separated, three significant digits, "–" for missing."""
    if value is None or value is pd.NA:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) or (hasattr(value, "dtype") and str(getattr(value, "dtype", "")).startswith("int")):
        return f"{int(value):,}" if fmt is None else fmt.format(value)
    if isinstance(value, float) or hasattr(value, "__float__"):
        number = float(value)
        if math.isnan(number):
            return "–"
        if fmt is not None:
            return fmt.format(number)
        if number == 0:
            return "0"
        if abs(number) >= 1000:
            return f"{number:,.0f}"
        if abs(number) >= 1e-3:
            return f"{number:.3g}"
        return f"{number:.2e}"
    return str(value)


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        if pd.isna(value):
            return "–"
    except (TypeError, ValueError):
        pass
    return format_number(value)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)

    def table(df: pd.DataFrame | None, fmt: str | None = None, caption: str | None = None,
              drop_empty: bool = True, max_height: bool = True, ids: list[str] | None = None) -> Markup:
        """A DataFrame as a table; the markup is in ``_table.html.j2``, numbers formatted consistently; ``ids``
        gives each row an element id, so a verdict can link to the row it judges."""
        if df is not None and drop_empty and not df.empty:
            df = df.loc[:, [c for c in df.columns if not (df[c].isna() | (df[c].astype(str) == "")).all()]]
        rows = [] if df is None else [[_cell(v) if fmt is None or isinstance(v, str) else format_number(v, fmt)
                                       for v in row] for row in df.itertuples(index=False, name=None)]
        columns = [] if df is None else [str(c) for c in df.columns]
        statuses = [columns.index("status")] if "status" in columns else []
        verdicts = [columns.index("verdict")] if "verdict" in columns else []
        above = set() if df is None else {(i, columns.index(c)) for c in columns if c in PCT_COLUMNS
                                          for i, v in enumerate(pd.to_numeric(df[c], errors="coerce")) if v > ABOVE_PCT}
        return Markup(env.get_template("_table.html.j2").render(
            columns=columns, rows=rows, caption=caption, status_columns=statuses, verdict_columns=verdicts,
            above=above, scroll=max_height and len(rows) > 16, ids=list(ids or [])))

    env.filters["table"] = table
    env.filters["num"] = lambda v, fmt=None: format_number(v, fmt)
    env.filters["pct"] = lambda v, digits=0: "–" if v is None or v != v else f"{float(v):.{digits}f}%"
    env.filters["yaml"] = lambda v: yaml.safe_dump(v, sort_keys=False, allow_unicode=True, default_flow_style=False)
    env.filters["slug"] = lambda v: "".join(ch if ch.isalnum() else "-" for ch in str(v)).strip("-").lower()
    env.tests["missing"] = lambda v: v is None or (isinstance(v, float) and math.isnan(v))
    return env


@dataclass(frozen=True)
class RenderedReport:
    path: Path
    size_bytes: int
    sections: list[dict[str, Any]]
    errors: list[dict[str, str]]


@dataclass(frozen=True)
class _Section:
    """One section as rendered (in this process or a forked one): its HTML (None when it has nothing to show), the
    error it raised, and the problems it found in the results and the baseline."""

    id: str
    title: str
    body: str | None
    error: str | None
    problems: tuple[list[Problem], list[Problem]]


def _section(ctx: ReportContext, env: Any, module: ModuleType) -> _Section:
    indexes = (ctx.results, ctx.baseline)
    known = [len(index.problems) if index else 0 for index in indexes]
    body, error = None, None
    try:
        data = module.build(ctx)
        if data is not None:
            body = env.get_template(module.TEMPLATE).render(ctx=ctx, **data)
    except Exception as exc:
        log.error("section %s failed:\n%s", module.ID, traceback.format_exc())
        error = f"{type(exc).__name__}: {exc}"
        body = env.get_template("_section_error.html.j2").render(message=error)
    found = [index.problems[n:] if index else [] for index, n in zip(indexes, known, strict=True)]
    return _Section(module.ID, module.TITLE, body, error, (found[0], found[1]))


def _render_sections(ctx: ReportContext, env: Any, strict: bool, workers: int
                     ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Every section that has something to show, rendered, ``workers`` at a time (forked processes: each builds
    its figures on a core of its own); a failing one as an error box (``strict``: raises)."""
    sections = run_all([partial(_section, ctx, env, module) for module in discover_sections()], workers)
    for section in sections:  # what a forked section found is not in this process's indexes yet
        for index, found in zip((ctx.results, ctx.baseline), section.problems, strict=True):
            for problem in found:
                if index is not None and problem not in index.problems:
                    index.problems.append(problem)
    failed = [s for s in sections if s.error is not None]
    if strict and failed:
        raise ReportError(f"report section {failed[0].id!r} failed: {failed[0].error}")
    rendered = [{"id": s.id, "title": s.title, "body": Markup(s.body)} for s in sections if s.body is not None]
    return rendered, [{"id": s.id, "title": s.title, "message": s.error or ""} for s in failed]


def render_report(
    results_dir: str | Path,
    output: str | Path,
    config: dict[str, Any],
    command: str,
    *,
    baseline_dir: str | Path | None = None,
    title: str | None = None,
    strict: bool | None = None,
    workers: int = 1,
) -> RenderedReport:
    """Build every section from the results and write one self-contained HTML file atomically.

    A section whose ``build`` raises is shown as an error box (with the message) and named at the top of
    the page, so one broken step never hides the others; with ``strict`` it fails the render instead
    and nothing is written. ``workers``: sections rendered at once, in forked processes (1: all in this one).
    """
    apply_style()
    results_dir, output = Path(results_dir), Path(output)
    strict = bool(config.get("strict", False)) if strict is None else strict
    limit = table_limit(config)
    results = ResultsIndex(results_dir, max_table_bytes=limit)
    if not results.targets:
        raise ReportError(f"{results_dir}: no results found (expected {results_dir}/<target>/...)")
    results.survey()
    baseline = None
    if baseline_dir is not None:
        baseline = ResultsIndex(Path(baseline_dir), max_table_bytes=limit)
        if not baseline.targets:
            raise ReportError(f"{baseline_dir}: no baseline results found (expected {baseline_dir}/<target>/...)")
        baseline.survey()
    ctx = ReportContext(results, output, config, command, baseline=baseline)
    env = environment()
    rendered, errors = _render_sections(ctx, env, strict, workers)
    report_config = config.get("report", {})
    page = env.get_template("base.html.j2").render(
        title=title or report_config.get("title") or platforms_title(ctx.devices),
        sections=rendered,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        git=git_state(),
        targets=results.targets,
        labels=ctx.target_labels,
        errors=errors,
        problems=[*results.problems, *(baseline.problems if baseline else [])],
        baseline=str(baseline_dir) if baseline_dir is not None else None,
        results_dir=str(results_dir),
    )
    write_atomic(output, page)
    size = output.stat().st_size
    if size > SIZE_BUDGET_BYTES:
        log.warning("report is %.1f MB, over its %.0f MB budget", size / 2**20, SIZE_BUDGET_BYTES / 2**20)
    return RenderedReport(output, size, [{"id": s["id"], "title": s["title"]} for s in rendered], errors)


def table_limit(config: Mapping[str, Any]) -> int:
    """``report.max_table_bytes``: the size over which a table is skipped, not read."""
    return int((config.get("report") or {}).get("max_table_bytes") or MAX_TABLE_BYTES)


def refresh_after_failure(results_dir: str | Path, config: Mapping[str, Any]) -> str | None:
    """After a failed run that put tables back: render the existing report again from the results as they now
    are, so it marks those tables stale instead of showing them as current (Snakemake did not run the report,
    whose inputs failed). Returns a line for the user, None when there is no report to refresh."""
    output = Path(config["report"]["output"])
    if not output.is_file():
        return None
    try:
        render_report(results_dir, output, dict(config), "snakemake (report refreshed after a failed run)",
                      strict=False)
    except Exception as exc:  # the summary of the failure matters more than this refresh
        return (f"{output} could not be rendered again ({type(exc).__name__}: {exc}); it may show stale tables as "
                "current")
    return f"{output} rendered again: it marks the tables put back as stale"
