"""MkDocs hooks: the reference pages and the example report are written at build time from their sources.

The configuration reference comes from the JSON schema and the command-line reference from the CLI's
argparse parser (``gpulab.reference``), so neither can drift; the example report is rendered from the
recorded runs under ``tests/fixtures`` (``gpulab.report.example``) into the site.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mkdocs.structure.files import File, Files

from gpulab.reference import cli_reference, config_reference
from gpulab.report.example import render_example
from gpulab.workflow.config import validate_config

ROOT = Path(__file__).resolve().parent.parent
_TMP = tempfile.TemporaryDirectory(prefix="gpulab-docs-")


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "reference/config.md", content=config_reference()))
    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    out = Path(_TMP.name) / "example"
    render_example(ROOT / "tests" / "fixtures", out, validate_config({}), "gpulab example-report -o reports/example")
    files.append(File.generated(config, "example/report.html", abs_src_path=str(out / "report.html")))
    return files
