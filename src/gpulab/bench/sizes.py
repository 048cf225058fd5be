"""Problem sizes of the benchmark matrix: from config, or "auto" scaled to the device.

Auto sizes always include the odd cases (98 432 elements, a 1823x781 softmax) that catch tail and masking bugs; on a
GPU they climb in powers of four to 1/16 of its memory (at most 4 GiB per fp32 tensor, as ``manual`` keeps several
temporaries), with the study's 16384x16384 GeLU and the goals' softmax shapes; on a CPU they stay small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpulab.core.device import DeviceInfo, max_tensor_bytes
from gpulab.core.dtypes import ITEMSIZE
from gpulab.core.ops import Shape, op_spec, parse_shape

ODD_ELEMENTS = 98_432
ODD_ROWS = (1823, 781)
STUDY_GELU_ELEMENTS = 16384 * 16384
# Softmax shapes named by the performance targets: many short rows, a square-ish block, very wide rows.
TARGET_SOFTMAX = [(16384, 1024), (4096, 16384), (65536, 256)]

GPU_VECTOR = [ODD_ELEMENTS, 2**20, 2**24, 2**26, STUDY_GELU_ELEMENTS, 2**30]
GPU_ROWS = [ODD_ROWS, (4096, 1024), *TARGET_SOFTMAX, (16384, 16384), (2048, 131072)]
CPU_VECTOR = [ODD_ELEMENTS, 2**20, 2**22]
CPU_ROWS = [ODD_ROWS, (1024, 1024), (64, 65536)]

FP32_BYTES = 4


def auto_sizes(op: str, info: DeviceInfo, max_bytes: int) -> list[Shape]:
    spec = op_spec(op)
    if spec.ndim == 1:
        candidates = [(n,) for n in (GPU_VECTOR if info.gpu_available else CPU_VECTOR)]
    else:
        candidates = list(GPU_ROWS if info.gpu_available else CPU_ROWS)
    shapes = [tuple(s) for s in candidates if spec.numel(tuple(s)) * FP32_BYTES <= max_bytes]
    # Never an empty matrix: the odd size is small enough for any device.
    return shapes or [tuple(candidates[0])]


def resolve_sizes(op: str, sizes: str | Mapping[str, Sequence[Any]] | Sequence[Any], info: DeviceInfo,
                  max_tensor_mib: int | str = "auto") -> list[Shape]:
    """The shapes one op is benchmarked at on this device: ``bench.sizes`` ("auto", the per-op mapping) or
    this op's own list of sizes (what the workflow hands each cell)."""
    if sizes == "auto" or (isinstance(sizes, Mapping) and op not in sizes):
        return auto_sizes(op, info, max_tensor_bytes(info, max_tensor_mib))
    if isinstance(sizes, Mapping):
        sizes, where = sizes[op], f"bench.sizes.{op}"
    else:
        where = f"the sizes of {op}"
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ValueError(f"{where} must be 'auto' or a list of sizes, got {sizes!r}")
    shapes = [parse_shape(op, value) for value in sizes]
    if not shapes:
        raise ValueError(f"{where} is empty")
    return list(dict.fromkeys(shapes))


def matrix_tensor_bytes(ops: Sequence[str], sizes: str | Mapping[str, Sequence[Any]], dtypes: Sequence[str],
                        info: DeviceInfo, max_tensor_mib: int | str = "auto") -> dict[str, dict[str, list[int]]]:
    """Bytes of one tensor of every case of the benchmark matrix, per access pattern and dtype: the sizes
    the ceilings are measured at (the same ``resolve_sizes`` the cells use, so every row finds its own)."""
    out: dict[str, dict[str, set[int]]] = {}
    for op in ops:
        spec = op_spec(op)
        for shape in resolve_sizes(op, sizes, info, max_tensor_mib):
            for dtype in dtypes:
                out.setdefault(spec.pattern, {}).setdefault(dtype, set()).add(spec.numel(shape) * ITEMSIZE[dtype])
    return {pattern: {dtype: sorted(b) for dtype, b in by_dtype.items()} for pattern, by_dtype in out.items()}
