"""Which GPU runtime stack PyTorch really loads: ``ldd`` of its libraries, classified into layers.

The study's ``ldd libtorch_python.so | grep -E "amd|hip|hsa"`` shows the ROCm stack (libamdhip64,
libhsa-runtime64, hipBLAS...). Here every dependency is kept and placed in a layer, so a CUDA build
(libcudart, cuBLAS, cuDNN...) and a CPU build read the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulab.core.tables import Column, TableSchema

# Layers from the top of the stack (what Python calls) to the bottom (what talks to the kernel driver).
LAYERS = (
    ("framework", "PyTorch"),
    ("gpu_runtime", "GPU runtime (HIP / CUDA)"),
    ("hsa_runtime", "HSA runtime"),
    ("compiler", "Code object / JIT compiler"),
    ("math", "Math libraries"),
    ("communication", "Collective communication"),
    ("profiling", "Tracing / profiling"),
    ("driver", "Kernel-driver interface"),
    ("system", "System libraries"),
)
LAYER_NAMES = dict(LAYERS)

# (layer, vendor, pattern on the soname). First match wins; order matters (hiprtc before hip*).
_RULES: tuple[tuple[str, str, str], ...] = (
    ("framework", "pytorch", r"lib(torch|c10|shm|caffe2|gomp-[0-9a-f]+|cupti-[0-9a-f]+)"),
    ("compiler", "amd", r"lib(amd_comgr|hiprtc)"),
    ("compiler", "nvidia", r"lib(nvrtc|nvJitLink|nvptxcompiler)"),
    ("gpu_runtime", "amd", r"libamdhip64"),
    ("gpu_runtime", "nvidia", r"libcudart"),
    ("hsa_runtime", "amd", r"libhsa-runtime64|libhsakmt"),
    (
        "math",
        "amd",
        r"lib(hipblaslt|hipblas|rocblas|miopen|MIOpen|hipfft|rocfft|hiprand|rocrand|hipsparselt|"
        r"hipsparse|rocsparse|hipsolver|rocsolver|aotriton|hipdnn|rocm_smi|amd_smi|roctx)",
    ),
    (
        "math",
        "nvidia",
        r"lib(cublasLt|cublas|cudnn|cufft|curand|cusparseLt|cusparse|cusolver|cufile|nvToolsExt"
        r"|nvrtc-builtins|cuda-pathfinder|nvshmem)",
    ),
    ("communication", "amd", r"librccl"),
    ("communication", "nvidia", r"libnccl"),
    ("profiling", "amd", r"lib(roctracer|rocprofiler|rocprof)"),
    ("profiling", "nvidia", r"libcupti"),
    ("driver", "amd", r"libdrm_amdgpu|libdrm\b|libdrm\.so"),
    ("driver", "nvidia", r"libcuda\.so|libnvidia-ml"),
)
_COMPILED = tuple((layer, vendor, re.compile(pattern)) for layer, vendor, pattern in _RULES)

RUNTIME_STACK = TableSchema(
    "runtime_stack",
    (
        Column("library", "str", "soname as ldd prints it"),
        Column("path", "str", "resolved path (empty when not found)"),
        Column("origin", "str", "torch wheel | pip package | system | not found | virtual"),
        Column(
            "layer",
            "str",
            "framework | gpu_runtime | hsa_runtime | compiler | math | communication | profiling | driver | system",
        ),
        Column("vendor", "str", "amd | nvidia | pytorch | system"),
        Column("needed_by", "str", "which of torch's libraries pulled it in (';'-separated)"),
    ),
    path="env/runtime_stack.csv",
)


@dataclass(frozen=True)
class LddEntry:
    library: str
    path: str | None  # None: not found; "" for the vdso


_LINE = re.compile(r"^\s*(?P<name>\S+)\s*(?:=>\s*(?P<target>not found|\S*))?\s*(?:\(0x[0-9a-f]+\))?\s*$")


def parse_ldd(text: str) -> list[LddEntry]:
    """Parse ``ldd`` output (each line ``soname => path (0xaddr)``, ``path (0xaddr)`` or ``=> not found``)."""
    out: list[LddEntry] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("ldd:", "statically linked")):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name, target = match["name"], match["target"]
        if target == "not found":
            out.append(LddEntry(name, None))
        elif target:
            out.append(LddEntry(name, target))
        else:  # the loader itself or the vdso: name is the path, or a virtual object
            out.append(LddEntry(Path(name).name, name if name.startswith("/") else ""))
    return out


def classify(library: str) -> tuple[str, str]:
    """(layer, vendor) of a soname."""
    for layer, vendor, pattern in _COMPILED:
        if pattern.match(library):
            return layer, vendor
    return "system", "system"


def origin(path: str | None, torch_lib_dir: str | None = None) -> str:
    if path is None:
        return "not found"
    if path == "":
        return "virtual"
    if torch_lib_dir and path.startswith(torch_lib_dir.rstrip("/") + "/"):
        return "torch wheel"
    if "/site-packages/" in path or "/dist-packages/" in path:
        return "pip package"
    return "system"


def stack_rows(ldd_outputs: Iterable[tuple[str, str]], torch_lib_dir: str | None) -> list[dict[str, str]]:
    """One row per distinct library over several ``(needed_by, ldd output)`` pairs, classified."""
    rows: dict[str, dict[str, str]] = {}
    for needed_by, text in ldd_outputs:
        for entry in parse_ldd(text):
            row = rows.get(entry.library)
            if row is None:
                layer, vendor = classify(entry.library)
                rows[entry.library] = {
                    "library": entry.library,
                    "path": entry.path or "",
                    "origin": origin(entry.path, torch_lib_dir),
                    "layer": layer,
                    "vendor": vendor,
                    "needed_by": needed_by,
                }
            elif needed_by not in row["needed_by"].split(";"):
                row["needed_by"] += ";" + needed_by
    order = {name: i for i, (name, _) in enumerate(LAYERS)}
    return sorted(rows.values(), key=lambda r: (order[r["layer"]], r["library"]))
