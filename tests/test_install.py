"""gpulab installs like any other package: a non-editable ``pip install .`` gives a working CLI from any directory.

The install goes into a new virtual environment that sees this interpreter's packages (a ``.pth`` file), so no
network is needed; the checkout is copied first so the build leaves nothing in it. The commands then run from a
directory unrelated to the checkout, with no PYTHONPATH, on recorded results from tests/fixtures.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
FIXTURE_RESULTS = REPO / "tests/fixtures/report/results"
# Run files and build leftovers a working checkout may hold: not part of the package.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".snakemake", ".cache", "results", "reports", "build", "dist",
                                     "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".whl")


def _run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a venv holding a non-editable install of this checkout."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_SOURCES)
    venv = root / "venv"
    # Without the venv's own pip and setuptools (ensurepip's setuptools 65 cannot build a wheel without `wheel`):
    # the build takes the locked setuptools and pip from this interpreter's packages.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    purelib = Path(_run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=root).stdout.strip())
    # This interpreter's packages (torch, snakemake, ...) behind the venv's own; its editable gpulab is not seen:
    # .pth files are read in site directories only, not in the paths they add.
    (purelib / "gpulab-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = _run([str(venv / "bin/python"), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                 "--quiet", str(source)], cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with no checkout, config.yaml or results of its own."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def test_the_package_imports_from_the_venv_not_the_checkout(installed: Path, elsewhere: Path) -> None:
    code = "import gpulab, gpulab.kernels, gpulab.report.browser; print(gpulab.__file__, gpulab.kernels.__file__)"
    proc = _run([str(installed / "python"), "-c", code], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    for path in proc.stdout.split():
        assert Path(path).is_relative_to(installed.parent), path


def test_help_lists_every_command(installed: Path, elsewhere: Path) -> None:
    proc = _run([str(installed / "gpulab"), "--help"], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    for command in ("report", "compare", "check-report"):
        assert command in proc.stdout


def test_report_renders_recorded_results(installed: Path, elsewhere: Path) -> None:
    proc = _run([str(installed / "gpulab"), "report", str(FIXTURE_RESULTS), "-o", "out/report.html"], cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (elsewhere / "out/report.html").read_text()
    assert "<img " in html and "could not be rendered" not in proc.stderr


def test_compare_renders_two_recorded_runs(installed: Path, elsewhere: Path) -> None:
    for name in ("a", "b"):
        shutil.copytree(FIXTURE_RESULTS, elsewhere / name, symlinks=True)
    proc = _run([str(installed / "gpulab"), "compare", "a", "b", "-o", "compare.html", "--fail-on", "regression"],
                cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (elsewhere / "compare.html").stat().st_size > 0
    assert "cells:" in proc.stderr


def test_check_report_without_a_browser_is_one_line(installed: Path, elsewhere: Path, tmp_path: Path) -> None:
    page = elsewhere / "page.html"
    page.write_text("<!DOCTYPE html><title>t</title>")
    env = {"PATH": str(tmp_path / "no-browser-here"), "GPULAB_CHROMIUM": ""}
    proc = subprocess.run([str(installed / "gpulab"), "check-report", str(page)], cwd=elsewhere, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 2
    assert proc.stderr == ("gpulab check-report: no Chromium found; install chromium (apt-get install chromium) "
                           "or set GPULAB_CHROMIUM\n")
