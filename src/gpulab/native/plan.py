"""What to build: the extension's sources, flags, GPU architectures and toolchain, and their digest.

``kernels/ext/`` holds one set of sources (``ops.cpp``, ``ops_cuda.cu``, hipified on ROCm, and headers); a CPU-only
library without a GPU, else the detected architecture only. The digest (sources, flags, archs, backend, compilers,
torch) names the build directory: a rebuild happens exactly when one of them changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpulab.core.device import DeviceInfo, detect, offload_archs
from gpulab.core.paths import KERNELS_DIR, default_cache_root
from gpulab.core.tools import find_compiler, run_tool

SOURCE_DIR = KERNELS_DIR / "ext"
CPU_SOURCES = ("ops.cpp",)
GPU_SOURCES = ("ops_cuda.cu",)
HEADERS = ("ops_common.h", "ops_kernels.cuh")
DEFAULT_EXTRA_CFLAGS = ("-O3",)
# The host unit registers its GPU entry points only in GPU builds (ops.cpp).
GPU_HOST_DEFINE = "-DGPULAB_WITH_CUDA"
# at::parallel_for is inline in PyTorch's headers (ATen/ParallelOpenMP.h: a `#pragma omp parallel`): without
# OpenMP the CPU kernels run on one thread. Linked too, so the library needs libgomp.so.1, which resolves to the
# copy PyTorch has already loaded.
HOST_OPENMP = "-fopenmp"


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines the built library; its digest names the build directory."""

    backend: str  # cpu | cuda | rocm: what the library is built for
    archs: tuple[str, ...]
    source_dir: Path
    sources: tuple[str, ...]
    headers: tuple[str, ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    extra_ldflags: tuple[str, ...]
    arch_env: tuple[tuple[str, str], ...]  # (TORCH_CUDA_ARCH_LIST | PYTORCH_ROCM_ARCH, value)
    host_compiler: str
    host_compiler_version: str
    device_compiler: str | None
    device_compiler_version: str | None
    torch_version: str
    digest: str = ""  # fixed when planned: content of the sources then, plus every field above

    def content_digest(self, source_dir: Path | None = None) -> str:
        h = hashlib.sha256()
        for name in (*self.sources, *self.headers):
            h.update(name.encode() + b"\0" + ((source_dir or self.source_dir) / name).read_bytes() + b"\0")
        meta = asdict(self)
        for key in ("source_dir", "digest"):  # the content matters, not where the checkout lives
            meta.pop(key)
        h.update(json.dumps(meta, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"gpulab_ops_{self.digest}"

    @property
    def compiler(self) -> str:
        """The compiler of the kernels: the device compiler on GPU builds, else the host compiler."""
        if self.device_compiler:
            return f"{Path(self.device_compiler).name} {self.device_compiler_version or ''}".strip()
        return f"{Path(self.host_compiler).name} {self.host_compiler_version}".strip()

    @property
    def flags(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.arch_env)
        cflags = " ".join(self.extra_cflags)
        cuda = " ".join(self.extra_cuda_cflags) if self.backend != "cpu" else ""
        ld = " ".join(self.extra_ldflags)
        parts = (env, f"cflags: {cflags}", f"device cflags: {cuda}" if cuda else "", f"ldflags: {ld}" if ld else "")
        return " ".join(p for p in parts if p)

    def build_dir(self, target: str, cache_root: Path | None = None) -> Path:
        """``.cache/extensions/<target>/<name>``: one directory per distinct (sources, flags, toolchain)."""
        return Path(cache_root or default_cache_root()) / "extensions" / target / self.name


def compiler_version(path: str) -> str:
    """One identifying line of ``<compiler> --version`` (nvcc: the release line; hipcc: the HIP line)."""
    name = Path(path).name
    result = run_tool(name, [path, "--version"], timeout_s=60,
                      env={"HIP_PLATFORM": "amd"} if name.startswith("hipcc") else None)
    lines = [ln.strip() for ln in (result.stdout or result.stderr).splitlines() if ln.strip()]
    key = {"nvcc": "release", "hipcc": "HIP version"}.get(name)
    hit = next((ln for ln in lines if key and key in ln), None)
    return hit or (lines[0] if lines else f"version unknown ({result.reason or 'no output'})")


def device_compiler(backend: str) -> tuple[str | None, str]:
    """Path of nvcc/hipcc that torch's extension builder will use, or (None, why not)."""
    from torch.utils import cpp_extension

    home, exe_name, what = ((cpp_extension.CUDA_HOME, "nvcc", "the CUDA toolkit matching torch") if backend == "cuda"
                            else (cpp_extension.ROCM_HOME, "hipcc", "ROCm's hipcc"))
    exe = find_compiler(exe_name, homes=[home])
    if exe is None:
        variable = "CUDA_HOME" if backend == "cuda" else "ROCM_HOME"
        return None, f"{exe_name} not found ({variable}={home or 'unset'}); install {what}"
    return exe, ""


def pinned_for(backend: str, pinned: Sequence[str] | None) -> list[str]:
    """Pinned archs that apply to this backend (one config may pin for AMD and NVIDIA targets alike)."""
    prefix = "gfx" if backend == "rocm" else "sm_"
    return [a for a in (pinned or []) if a.startswith(prefix)]


def arch_environment(backend: str, archs: Sequence[str]) -> dict[str, str]:
    """The variable torch's builder reads to choose GPU architectures, set to exactly ``archs``."""
    if backend == "cuda":
        values = []
        for arch in archs:  # sm_90 -> 9.0, sm_90a -> 9.0a, sm_120 -> 12.0
            match = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
            if not match:
                raise ValueError(f"cannot turn {arch!r} into a TORCH_CUDA_ARCH_LIST entry")
            values.append(f"{match.group(1)}.{match.group(2)}{match.group(3)}")
        return {"TORCH_CUDA_ARCH_LIST": ";".join(values)}
    if backend == "rocm":
        return {"PYTORCH_ROCM_ARCH": ";".join(archs)}
    return {}


def _missing_sources(source_dir: Path, backend: str) -> list[str]:
    names = (*CPU_SOURCES, *HEADERS, *(GPU_SOURCES if backend != "cpu" else ()))
    return [n for n in names if not (source_dir / n).is_file()]


def _host_toolchain(env: Mapping[str, str]) -> tuple[str | None, str]:
    host = env.get("CXX", "c++")
    host_path = shutil.which(host, path=env.get("PATH"))
    if host_path is None:
        return None, f"no host C++ compiler: {host!r} (CXX or c++) not found on PATH"
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return None, "ninja not found (torch.utils.cpp_extension needs it): pip install ninja"
    return host_path, ""


def plan_build(
    device: DeviceInfo | None = None,
    pinned_archs: Sequence[str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    source_dir: Path = SOURCE_DIR,
    environ: Mapping[str, str] | None = None,
    extra_ldflags: Sequence[str] = (),
) -> tuple[BuildSpec | None, str]:
    """What to build on this machine, or (None, why nothing can be built)."""
    import torch

    info = device or detect()
    env = os.environ if environ is None else environ
    flags = tuple(DEFAULT_EXTRA_CFLAGS if extra_cflags is None else extra_cflags)
    backend = info.backend if info.gpu_available else "cpu"
    missing = _missing_sources(source_dir, backend)
    if missing:
        raise FileNotFoundError(f"extension sources missing in {source_dir}: {', '.join(missing)}")
    host_path, why = _host_toolchain(env)
    if host_path is None:
        return None, why
    archs: list[str] = []
    device_path = device_version = None
    if backend != "cpu":
        device_path, why = device_compiler(backend)
        if device_path is None:
            return None, why
        device_version = compiler_version(device_path)
        archs = pinned_for(backend, pinned_archs) or offload_archs(info, None, dict(env))
        if not archs:
            return None, f"no GPU architecture detected for backend {backend}"
    gpu = backend != "cpu"
    spec = BuildSpec(
        backend=backend, archs=tuple(archs), source_dir=source_dir,
        sources=CPU_SOURCES + (GPU_SOURCES if gpu else ()), headers=HEADERS,
        extra_cflags=flags + (HOST_OPENMP,) + ((GPU_HOST_DEFINE,) if gpu else ()),
        extra_cuda_cflags=flags if gpu else (), extra_ldflags=(HOST_OPENMP, *extra_ldflags),
        arch_env=tuple(sorted(arch_environment(backend, archs).items())),
        host_compiler=host_path, host_compiler_version=compiler_version(host_path),
        device_compiler=device_path, device_compiler_version=device_version, torch_version=torch.__version__,
    )
    return replace(spec, digest=spec.content_digest()), ""
