"""The PyTorch C++/CUDA/HIP extension (``torch.ops.gpulab``): plan, build, load, and the step's tables.

:mod:`~gpulab.native.plan` (what to build), :mod:`~gpulab.native.compile` (the build and loading),
:mod:`~gpulab.native.manifest` (what every user loads, through :func:`load_from_manifest`),
:mod:`~gpulab.native.checks` (correctness and bad input) and :mod:`~gpulab.native.step` (rule ``extension_build``).
"""

from gpulab.native.compile import ExtensionBuildError, ExtensionLoad, build, loaded
from gpulab.native.manifest import load_from_manifest, manifest_outcome, read_manifest, write_manifest
from gpulab.native.plan import BuildSpec, plan_build

__all__ = [
    "BuildSpec",
    "ExtensionBuildError",
    "ExtensionLoad",
    "build",
    "load_from_manifest",
    "loaded",
    "manifest_outcome",
    "plan_build",
    "read_manifest",
    "write_manifest",
]
