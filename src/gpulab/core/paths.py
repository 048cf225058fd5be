"""Where gpulab's own files are: package data found through the package, run files in the working directory.

Nothing here is derived from where the package happens to be installed other than its own data (schema,
templates, kernel sources), so an editable install, a wheel and a workflow checkout behave the same. The cache,
the results and the report belong to the directory the workflow (or the CLI) runs in.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from gpulab.core.jobenv import CACHE_VAR

PACKAGE_DIR = Path(str(resources.files("gpulab")))
CONFIG_SCHEMA = PACKAGE_DIR / "schemas" / "config.schema.yaml"
TABLE_SCHEMAS = PACKAGE_DIR / "schemas" / "tables.yaml"
KERNELS_DIR = PACKAGE_DIR / "kernels"
# The HIP translation units, relative to the package (and to the checkout, whose kernels/ the package links): the
# standalone program, and the extension's device code as hipcc compiles it for every AMD architecture
# (gpulab.toolchains.hipcc). The headers beside a unit are part of it.
HIP_PROGRAM = "kernels/hip/vector_add.hip"
HIP_SOURCES = (HIP_PROGRAM, "kernels/ext/ops_kernels_hip.hip")
CACHE_ENV = CACHE_VAR  # overrides the workflow's cache (tests, read-only checkouts)


def kernel_relpath(path: str | Path) -> str:
    """A kernel file as ``kernels/<sub>/<file>``, the same whether the package is a checkout or installed; a kernel
    file of an op registered from outside the package (gpulab.core.ops.register_op) as its own path."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(KERNELS_DIR.resolve()):
        return str(resolved)
    return str(Path("kernels") / resolved.relative_to(KERNELS_DIR.resolve()))


def default_cache_root() -> Path:
    """The run's own cache, ``.cache/`` in the working directory (git-ignored), unless :data:`CACHE_ENV` says."""
    return Path(os.environ.get(CACHE_ENV) or Path.cwd() / ".cache")


# Compiler caches every job shares (set by the step runner, gpulab.workflow.step): compiled Triton kernels, and
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
