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


# Compiler caches every job shares (set by the step runner, gpulab.step): compiled Triton kernels, and
# Inductor's FX graph, kernel and precompiled-header caches. Each keys its entries by source, compiler version
# and device, so a rerun after editing one kernel recompiles only that kernel.
COMPILER_CACHES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
# Triton's autotuner keeps each key's winning configuration in its cache too (keyed by kernel source, configs,
# tuning key and GPU architecture): a rerun times the same configuration without autotuning it again.
AUTOTUNE_CACHE = {"TRITON_CACHE_AUTOTUNING": "1"}


def compiler_cache_env(root: Path | None = None) -> dict[str, str]:
    """The compiler cache variables, each directory under the workflow's cache."""
    root = root or default_cache_root()
    return {**{name: str(root / sub) for name, sub in COMPILER_CACHES.items()}, **AUTOTUNE_CACHE}
