"""The extension's device code as PyTorch's ROCm build compiles it, on a machine without ROCm PyTorch.

``torch.utils.cpp_extension`` hipifies ``kernels/ext/ops_cuda.cu`` and compiles it with its own HIP flags and
``--offload-arch`` from ``PYTORCH_ROCM_ARCH``; all of these are importable from a CPU build of PyTorch, so the same
hipified unit is compiled here, one architecture at a time.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from gpulab.core.paths import KERNELS_DIR

GPU_SOURCE = "ops_cuda.cu"  # what torch hipifies; its headers beside it are copied and hipified with it
NAME = "kernels/ext/ops_cuda.cu (hipified)"  # the table's source column
EXTENSION_NAME = "gpulab_ops"


def sources() -> list[Path]:
    """The files hipify reads: the unit and the headers beside it."""
    ext = KERNELS_DIR / "ext"
    return sorted({ext / GPU_SOURCE, *ext.glob("*.h"), *ext.glob("*.cuh")})


def hipify(build_dir: Path) -> Path:
    """Copy the extension's GPU sources to ``build_dir`` and hipify them with cpp_extension's arguments;
    the hipified unit's path."""
    from torch.utils.hipify import hipify_python

    build_dir.mkdir(parents=True, exist_ok=True)
    for path in sources():
        shutil.copy2(path, build_dir / path.name)
    unit = str((build_dir / GPU_SOURCE).resolve())
    torch_dir = str(Path(hipify_python.__file__).resolve().parents[2])
    with contextlib.redirect_stdout(io.StringIO()):  # hipify prints a banner even when told not to
        result = hipify_python.hipify(project_directory=str(build_dir), output_directory=str(build_dir),
                                      header_include_dirs=[], extra_files=[unit],
                                      ignores=[os.path.join(torch_dir, "*")], show_detailed=False,
                                      show_progress=False, is_pytorch_extension=True)
    hipified = result[unit].hipified_path if unit in result else None
    if not hipified:
        raise RuntimeError(f"hipify left {GPU_SOURCE} as it was: {result.get(unit)}")
    return Path(hipified)


@contextmanager
def _rocm_arch(arch: str):
    saved = os.environ.get("PYTORCH_ROCM_ARCH")
    os.environ["PYTORCH_ROCM_ARCH"] = arch
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_ROCM_ARCH")
        else:
            os.environ["PYTORCH_ROCM_ARCH"] = saved


def device_flags(arch: str, extra_cuda_cflags: tuple[str, ...] = ("-O3",)) -> tuple[str, ...]:
    """cpp_extension's HIP compile flags for ``arch`` (set as ``PYTORCH_ROCM_ARCH``), in its order."""
    from torch.utils import cpp_extension as ce

    includes = [f for path in ce.include_paths("cpu") for f in ("-isystem", path)]
    common = [f"-DTORCH_EXTENSION_NAME={EXTENSION_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H", *includes]
    flags = ["-DWITH_HIP", *common, *ce.COMMON_HIP_FLAGS, *ce.COMMON_HIPCC_FLAGS, "-std=c++20"]
    with _rocm_arch(arch):
        flags += ce._get_rocm_arch_flags(flags)
    return (*flags, *extra_cuda_cflags)
