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

import numpy as np
import pandas as pd

from gpulab.device import DeviceInfo, detect
from gpulab.dtypes import ITEMSIZE, torch_dtype
from gpulab.tables import Column, TableSchema
from gpulab.timing import TimingSettings, measure

CEILINGS = TableSchema(
    "ceilings",
    (
        Column("kind", "str", "copy (device-to-device, bytes read + written) | copy_curve (the same copy at "
               "smaller buffers: what moving that many bytes reaches) | matmul (square, 2n^3 flops)"),
        Column("dtype", "str", "fp32 | tf32 | fp16 | bf16"),
        Column("size", "int", "bytes per copy buffer, or the matmul side n (auto on CPU: smaller for slow dtypes)"),
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


# One CPU product of the auto size should take at most this long: CPUs without native fp16/bf16 matrix
# instructions emulate them (seen: 5 s for one 1024^3 bf16 product on a 2-core VM), and ten timed
# repetitions of that would dominate the whole default CPU run.
CPU_MATMUL_PROBE_S = 0.2
MIN_MATMUL_N = 128


def fit_cpu_matmul(n: int, dtype: Any, probe_s: float = CPU_MATMUL_PROBE_S) -> int:
    """Largest side <= n (halving) whose single CPU product takes at most ``probe_s``."""
    import time

    import torch

    while n > MIN_MATMUL_N:
        a = torch.randn(n, n).to(dtype)
        start = time.perf_counter()
        a @ a
        if time.perf_counter() - start <= probe_s:
            break
        n //= 2
    return n


def copy_curve_sizes(copy_bytes: int) -> list[int]:
    """Buffer sizes of the copy curve: powers of four from 4 MiB up to (excluding) the main copy."""
    sizes, size = [], 4 * 2**20
    while size < copy_bytes:
        sizes.append(size)
        size *= 4
    return sizes


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
    # Smaller copies reach less (launch and tail effects): the curve says what a kernel moving that many
    # bytes can expect, for small benchmark cases whose share of the big copy's rate looks low.
    for buffer_bytes in copy_curve_sizes(copy_bytes):
        numel = buffer_bytes // ITEMSIZE["fp32"]
        pairs = [(torch.randn(numel, device=dev), torch.empty(numel, device=dev)) for _ in range(2)]
        timing_row = measure([lambda s=s, d=d: d.copy_(s) for s, d in pairs], timing, info)
        rows.append({**base, "status": "ok", "kind": "copy_curve", "dtype": "fp32", "size": buffer_bytes,
                     "gbps": 2 * buffer_bytes / (timing_row.median_ms / 1e3) / 1e9, **timing_row.as_row()})
        del pairs
    shrink = config.get("matmul_n", "auto") == "auto" and not info.gpu_available
    for mode in matmul_modes:
        dtype = torch_dtype("fp32" if mode == "tf32" else mode)
        side = fit_cpu_matmul(n, dtype) if shrink else n
        a = torch.randn(side, side, device=dev, dtype=dtype)
        b = torch.randn(side, side, device=dev, dtype=dtype)
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
                "size": side,
                "tflops": 2 * side**3 / (timing_row.median_ms / 1e3) / 1e12,
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

    def copy_gbps_for(self, bytes_moved: float) -> float:
        """Copy bandwidth measured when moving about ``bytes_moved`` bytes (read + written), interpolated
        in log size over the copy curve and the main copy; the main copy's rate beyond it."""
        copies = self.table[(self.table["status"] == "ok") & self.table["kind"].isin(["copy", "copy_curve"])]
        if copies.empty:
            return math.nan
        moved = (2 * copies["size"].astype(float)).to_numpy()
        gbps = copies["gbps"].astype(float).to_numpy()
        points = sorted(zip(moved, gbps, strict=True))
        xs = [math.log(m) for m, _ in points]
        return float(np.interp(math.log(max(bytes_moved, 1.0)), xs, [g for _, g in points]))

    def matmul_tflops(self, dtype: str) -> float:
        return self._value("matmul", dtype, "tflops")


def pct_of(value: float, ceiling: float) -> float:
    """Percentage of a ceiling; NaN when either is unknown."""
    if not ceiling or math.isnan(ceiling) or value is None or math.isnan(value):
        return math.nan
    return 100.0 * value / ceiling
