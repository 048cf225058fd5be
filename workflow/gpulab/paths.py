"""Where the workflow's own files live, resolved from this package (installed editable from the repo)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
WORKFLOW_DIR = REPO_ROOT / "workflow"
SCHEMA_DIR = WORKFLOW_DIR / "schemas"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"
KERNELS_DIR = REPO_ROOT / "kernels"
DEFAULT_CONFIG = REPO_ROOT / "config.yaml"
CACHE_ENV = "GPULAB_CACHE_DIR"  # overrides the workflow's cache (tests, read-only checkouts)


def default_cache_root() -> Path:
    """The workflow's own cache, ``.cache/`` in the checkout (git-ignored), unless $GPULAB_CACHE_DIR says."""
    return Path(os.environ.get(CACHE_ENV) or REPO_ROOT / ".cache")
