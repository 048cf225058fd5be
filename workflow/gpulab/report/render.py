"""Render ``reports/report.html``: discover the section modules, build each, fill the templates.

A section is one module in ``gpulab.report.sections`` (``ORDER``, ``ID``, ``TITLE``, ``TEMPLATE``,
``build(ctx)``) plus one template in ``templates/``. ``build`` returns the template's variables, or
None when the results hold nothing for it.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from gpulab.env_capture import git_state
from gpulab.report import sections as sections_pkg
from gpulab.report.plots import apply_style
from gpulab.report.results import ResultsIndex
from gpulab.tables import write_atomic

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass
class ReportContext:
    results: ResultsIndex
    output: Path
    config: dict[str, Any]
    command: str
    extras: dict[str, Any] = field(default_factory=dict)

    def link(self, path: str | Path) -> str:
        """Relative link from the report to a file (logs, traces), so the page works when copied with results."""
        return Path(os.path.relpath(Path(path).resolve(), self.output.resolve().parent)).as_posix()


def discover_sections() -> list[ModuleType]:
    modules = [importlib.import_module(f"{sections_pkg.__name__}.{m.name}")
               for m in pkgutil.iter_modules(sections_pkg.__path__)]
    return sorted((m for m in modules if hasattr(m, "build")), key=lambda m: m.ORDER)


def html_table(df: pd.DataFrame, float_format: str = "{:,.3g}") -> Markup:
    """A DataFrame as an HTML table (pandas renders it; we only style it)."""
    if df is None or df.empty:
        return Markup("<p class='muted'>(no rows)</p>")
    return Markup(df.to_html(index=False, na_rep="–", classes="data", border=0, escape=True,
                             float_format=lambda v: float_format.format(v)))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["table"] = html_table
    env.filters["num"] = lambda v, fmt="{:,.3g}": "–" if v is None or v != v else fmt.format(v)
    return env


def render_report(results_dir: str | Path, output: str | Path, config: dict[str, Any], command: str) -> Path:
    apply_style()
    output = Path(output)
    ctx = ReportContext(ResultsIndex(Path(results_dir)), output, config, command)
    env = environment()
    rendered = []
    for module in discover_sections():
        data = module.build(ctx)
        if data is None:
            continue
        body = env.get_template(module.TEMPLATE).render(ctx=ctx, **data)
        rendered.append({"id": module.ID, "title": module.TITLE, "body": Markup(body)})
    page = env.get_template("base.html.j2").render(
        title=config.get("report", {}).get("title", "gpulab report"),
        sections=rendered,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        git=git_state(),
        targets=ctx.results.targets,
    )
    write_atomic(output, page)
    return output
