"""Vendors' datasheet memory bandwidth per device, matched on the device name env capture records.

A datasheet figure is not a ceiling (``gpulab.core.ceilings`` measures those): rows carry it beside the measured
ceiling so a reader sees both how close a kernel came to what this machine can do and how much of the part's
rated bandwidth that is. GB/s are 1e9 bytes/s, as the vendors state them. A device not listed is ``unknown``.
"""

from __future__ import annotations

import math
import re

# (pattern searched in the lower-cased device name, GB/s, source). More specific patterns first.
DATASHEET_GBPS: tuple[tuple[str, float, str], ...] = (
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM 3.35 TB/s, PCIe 2 TB/s, NVL 3.9 TB/s.
    (r"h100.*pcie", 2000.0, "NVIDIA H100 datasheet, H100 PCIe"),
    (r"h100 nvl", 3900.0, "NVIDIA H100 datasheet, H100 NVL"),
    (r"h100", 3350.0, "NVIDIA H100 datasheet, H100 SXM (torch names it 'NVIDIA H100 80GB HBM3')"),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): SXM and NVL 4.8 TB/s.
    (r"h200", 4800.0, "NVIDIA H200 datasheet"),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s,
    # 40GB 1,555 GB/s.
    (r"a100.*80gb.*pcie|a100.*pcie.*80gb", 1935.0, "NVIDIA A100 datasheet, A100 80GB PCIe"),
    (r"a100.*80gb", 2039.0, "NVIDIA A100 datasheet, A100 80GB SXM"),
    (r"a100", 1555.0, "NVIDIA A100 datasheet, A100 40GB"),
    # AMD Instinct data sheets (amd.com/en/products/accelerators/instinct): MI325X 6 TB/s, MI300X and MI300A
    # 5.3 TB/s, MI250X and MI250 3.2 TB/s (3,276.8 GB/s), MI210 1.6 TB/s (1,638.4 GB/s).
    (r"mi325x", 6000.0, "AMD Instinct MI325X data sheet"),
    (r"mi300", 5300.0, "AMD Instinct MI300X / MI300A data sheet"),
    (r"mi250", 3276.8, "AMD Instinct MI250X / MI250 data sheet"),
    (r"mi210", 1638.4, "AMD Instinct MI210 data sheet"),
    # AMD Ryzen AI Max+ 395 (gfx1151, Radeon 8060S): LPDDR5X-8000 on a 256-bit bus, 8000e6 x 32 bytes = 256 GB/s.
    (r"8060s", 256.0, "AMD Ryzen AI Max+ 395 specifications: LPDDR5X-8000, 256-bit"),
)


def datasheet_gbps(device: object) -> float:
    """The datasheet bandwidth of ``device`` (its name), NaN when it is not in DATASHEET_GBPS."""
    name = str(device or "").lower()
    return next((gbps for pattern, gbps, _ in DATASHEET_GBPS if re.search(pattern, name)), math.nan)


def pct_of_datasheet(gbps: float, device: object) -> tuple[float, float]:
    """(datasheet GB/s, ``gbps`` as a percentage of it); NaN where either is unknown."""
    sheet = datasheet_gbps(device)
    if math.isnan(sheet) or gbps is None or not math.isfinite(gbps):
        return sheet, math.nan
    return sheet, 100.0 * gbps / sheet
