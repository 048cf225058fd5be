"""Process environment every job of the workflow inherits (set once, when the Snakefile is parsed)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path


def prepare(workflow_basedir: str | Path, argv: Sequence[str]) -> None:
    # Jobs import gpulab from this checkout even where it is not installed (conda envs, cluster nodes).
    package_root = str(Path(workflow_basedir) / "workflow")
    current = os.environ.get("PYTHONPATH", "")
    if package_root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, current) if p)
    # The report names the exact command; kept out of params so it never triggers reruns.
    os.environ.setdefault("GPULAB_COMMAND", shlex.join(["snakemake", *argv[1:]]))
