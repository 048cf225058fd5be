"""Measured hardware ceilings: device-to-device copy bandwidth and large-matmul rate, per dtype.

Numbers from spec sheets are not ceilings: every benchmark row is placed against what this machine
measured here, with the project's timing function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.device import DeviceInfo, detect
from gpulab.dtypes import ITEMSIZE, torch_dtype
from gpulab.tables import Column, TableSchema
from gpulab.timing import TimingSettings, measure

CEILINGS = TableSchema(
    "ceilings",
    (
        Column("kind", "str", "copy (device-to-device, bytes read + written) | matmul (square, 2n^3 flops)"),
        Column("dtype", "str", "fp32 | tf32 | fp16 | bf16"),
        Column("size", "int", "bytes per copy buffer, or the matmul side n"),
        Column("gbps", "float", "achieved GB/s (1e9 bytes/s), copy rows"),
        Column("tflops", "float", "achieved TFLOP/s, matmul rows"),
    ),
    measured=True,
)


def resolve_sizes(config: Mapping[str, Any], info: DeviceInfo) -> tuple[int, int]:
    """(copy bytes per buffer, matmul n) from config, where "auto" scales with the device."""
    copy_mib = config.get("copy_mib", "auto")
    matmul_n = config.get("matmul_n", "auto")
    if copy_mib == "auto":
        copy_mib = 1024 if info.gpu_available else 64
        if info.gpu_available and info.total_memory_bytes:
            copy_mib = min(copy_mib, info.total_memory_bytes // 2**20 // 8)
    if matmul_n == "auto":
        matmul_n = 8192 if info.gpu_available else 1024
    return int(copy_mib) * 2**20, int(matmul_n)


def measure_ceilings(
    config: Mapping[str, Any],
    timing: TimingSettings,
    *,
    target: str,
    fingerprint: str,
    device: DeviceInfo | None = None,
) -> list[dict[str, Any]]:
    import torch

    info = device or detect()
    copy_bytes, n = resolve_sizes(config, info)
    dev = info.torch_device
    base = {"target": target, "fingerprint": fingerprint}
    rows: list[dict[str, Any]] = []
    dtypes = list(config.get("dtypes", ["fp32", "fp16", "bf16"]))
    # TF32 is a CUDA-only matmul mode (ROCm has none); measured so tf32 variants have a ceiling.
    matmul_modes = [*dtypes, "tf32"] if info.backend == "cuda" and "fp32" in dtypes else dtypes
    for name in dtypes:
        numel = copy_bytes // ITEMSIZE[name]
        # Two source/destination pairs rotated, on top of the cache flush, so no copy hits the cache.
        pairs = [
            (
                torch.randn(numel, device=dev).to(torch_dtype(name)),
                torch.empty(numel, device=dev, dtype=torch_dtype(name)),
            )
            for _ in range(2)
        ]
        timing_row = measure([lambda s=s, d=d: d.copy_(s) for s, d in pairs], timing, info)
        seconds = timing_row.median_ms / 1e3
        rows.append(
            {
                **base,
                "status": "ok",
                "kind": "copy",
                "dtype": name,
                "size": copy_bytes,
                "gbps": 2 * copy_bytes / seconds / 1e9,
                **timing_row.as_row(),
            }
        )
        del pairs
    for mode in matmul_modes:
        dtype = torch_dtype("fp32" if mode == "tf32" else mode)
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        try:
            timing_row = measure(lambda a=a, b=b: a @ b, timing, info)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        rows.append(
            {
                **base,
                "status": "ok",
                "kind": "matmul",
                "dtype": mode,
                "size": n,
                "tflops": 2 * n**3 / (timing_row.median_ms / 1e3) / 1e12,
                **timing_row.as_row(),
            }
        )
        del a, b
    return rows


@dataclass(frozen=True)
class Ceilings:
    """Lookup of one target's measured ceilings (read from ``bench/ceilings.csv``)."""

    table: pd.DataFrame

    @classmethod
    def load(cls, path: str | Path) -> Ceilings:
        return cls(CEILINGS.read(path))

    def _value(self, kind: str, dtype: str, column: str) -> float:
        hit = self.table[(self.table["kind"] == kind) & (self.table["dtype"] == dtype) & (self.table["status"] == "ok")]
        return float(hit[column].iloc[0]) if not hit.empty else math.nan

    def copy_gbps(self, dtype: str = "fp32") -> float:
        value = self._value("copy", dtype, "gbps")
        # Copy bandwidth hardly depends on dtype; fall back to any measured copy rather than NaN.
        if math.isnan(value):
            ok = self.table[(self.table["kind"] == "copy") & (self.table["status"] == "ok")]
            value = float(ok["gbps"].max()) if not ok.empty else math.nan
        return value

    def matmul_tflops(self, dtype: str) -> float:
        return self._value("matmul", dtype, "tflops")


def pct_of(value: float, ceiling: float) -> float:
    """Percentage of a ceiling; NaN when either is unknown."""
    if not ceiling or math.isnan(ceiling) or value is None or math.isnan(value):
        return math.nan
    return 100.0 * value / ceiling
