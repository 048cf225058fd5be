"""The GPU architectures kernels are compiled for, with the hardware limits occupancy is computed from.

One table, one formula; the sources of each limit (CUDA's per-compute-capability specifications, LLVM's AMDGPU
limits and the CDNA/RDNA ISA guides) are listed in docs/architecture.md. The AMD register arithmetic is checked
against LLVM's own "; Occupancy:" note in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab.kernels.triton.config import Target


@dataclass(frozen=True)
class Arch:
    name: str  # gfx1151 | sm_90: the compiler's name
    backend: str  # hip | cuda
    device: str  # example device, for the report
    warp_size: int
    unit: str  # what one occupancy figure counts: SM, CU or WGP
    simds: int  # SIMDs (AMD) or SM sub-partitions (NVIDIA) per unit
    max_warps_per_simd: int
    regs_per_simd: int  # AMD: VGPRs per lane per SIMD; NVIDIA: 32-bit registers per sub-partition
    reg_granule: int  # AMD: VGPRs per lane; NVIDIA: registers per warp
    lds_per_unit: int  # bytes
    max_blocks_per_unit: int
    sgprs_per_simd: int = 0  # 0: SGPRs do not limit occupancy
    lds_reserved_per_block: int = 0

    @property
    def target(self) -> Target:
        return Target(backend=self.backend, warp_size=self.warp_size, arch=self.name)

    @property
    def family(self) -> str:
        return self.target.family

    @property
    def max_warps_per_unit(self) -> int:
        return self.max_warps_per_simd * self.simds


_CDNA = dict(backend="hip", warp_size=64, unit="CU", simds=4, max_warps_per_simd=8, regs_per_simd=512,
             reg_granule=8, lds_per_unit=64 * 1024, max_blocks_per_unit=16, sgprs_per_simd=800)
_RDNA3 = dict(backend="hip", warp_size=32, unit="WGP", simds=4, max_warps_per_simd=16, regs_per_simd=1536,
              reg_granule=24, lds_per_unit=128 * 1024, max_blocks_per_unit=32)
_NVIDIA = dict(backend="cuda", warp_size=32, unit="SM", simds=4, max_warps_per_simd=16, regs_per_simd=16384,
               reg_granule=256, max_blocks_per_unit=32, lds_reserved_per_block=1024)

ARCHS = {
    a.name: a
    for a in (
        Arch("gfx1151", device="Radeon 8060S (Strix Halo iGPU, RDNA 3.5), the study's GPU", **_RDNA3),
        Arch("gfx1100", device="Radeon RX 7900 XTX (RDNA 3)", **_RDNA3),
        Arch("gfx942", device="Instinct MI300X (CDNA 3)", **_CDNA),
        Arch("gfx90a", device="Instinct MI250X / MI210 (CDNA 2)", **_CDNA),
        Arch("sm_90", device="H100 (Hopper)", lds_per_unit=228 * 1024, **_NVIDIA),
        Arch("sm_80", device="A100 (Ampere)", lds_per_unit=164 * 1024, **_NVIDIA),
    )
}


def arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}") from None


def _ceil_to(value: int, granule: int) -> int:
    return math.ceil(value / granule) * granule


def warps_per_simd_by_registers(a: Arch, registers: int, sgprs: int = 0) -> int:
    """Warps one SIMD (sub-partition) can hold given the per-thread register count."""
    if a.backend == "cuda":
        per_warp = _ceil_to(max(registers, 1) * a.warp_size, a.reg_granule)
    else:
        per_warp = _ceil_to(max(registers, 1), a.reg_granule)
    limit = min(a.max_warps_per_simd, a.regs_per_simd // per_warp)
    if a.sgprs_per_simd and sgprs:
        limit = min(limit, a.sgprs_per_simd // _ceil_to(sgprs, 16))
    return limit


def occupancy(a: Arch, registers: int, num_warps: int, lds_bytes: int, sgprs: int = 0) -> tuple[int, str]:
    """(resident warps per unit, what limits it) for blocks of ``num_warps`` warps; whole blocks only."""
    # On a tie the hardware maxima are named first: resources limit only when they bind below them.
    limits = {
        "warps": a.max_warps_per_unit // num_warps,
        "blocks": a.max_blocks_per_unit,
        "registers": warps_per_simd_by_registers(a, registers, sgprs) * a.simds // num_warps,
    }
    block_lds = lds_bytes + a.lds_reserved_per_block
    if block_lds:
        limits["shared memory"] = a.lds_per_unit // block_lds
    limiter = min(limits, key=lambda k: limits[k])
    return limits[limiter] * num_warps, limiter
