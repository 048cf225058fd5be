"""The PyTorch C++/CUDA/HIP extension (``torch.ops.gpulab``): plan, build, load, and the step's tables.

- :mod:`gpulab.native.plan`: sources, flags, architectures, toolchain, digest (what to build);
- :mod:`gpulab.native.compile`: the build with torch's extension builder, and loading a library;
- :mod:`gpulab.native.manifest`: the manifest the build step writes and every user of the operators
  loads through :func:`load_from_manifest` (the DAG carries it; nothing rebuilds behind the workflow);
- :mod:`gpulab.native.checks`: correctness against a float64 reference, and bad input in subprocesses;
- :mod:`gpulab.native.step`: the ``extension_build`` rule.
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
