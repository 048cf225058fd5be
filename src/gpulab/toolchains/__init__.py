"""Every kernel compiled for the study's GPU architectures, with the resources each compile uses.

No GPU is needed: Triton compiles ``kernels/triton/`` for a named ``GPUTarget``, clang (and Debian's hipcc where its
device libraries cover the architecture) the HIP sources. One row per kernel x launch x dtype x architecture:
registers, spills, scratch, LDS, occupancy (``archs``), code size, compile seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gpulab.core.tables import Column, TableSchema

KERNEL_RESOURCES = TableSchema(
    "kernel_resources",
    (
        Column("arch", "str", "architecture compiled for: gfx1151 | gfx1100 | gfx942 | gfx90a | sm_90 | sm_80"),
        Column("family", "str", "rdna (AMD wave32) | cdna (AMD wave64) | nvidia: picks the launch configurations"),
        Column("backend", "str", "hip | cuda"),
        Column("compiler", "str", "what made the row: triton <version> | clang <version> (HIP device code) | "
           "hipcc (clang <version>)"),
        Column("source", "str", "source file, relative to the repository"),
        Column("op", "str", "the op the kernel implements (gpulab.core.ops: gelu | softmax | add), or llm_decode "
               "(the fast LLM engine's decode step)"),
        Column("kernel", "str", "kernel function"),
        Column("variant", "str", "launch configuration (Triton constants and num_warps) or compiler flags"),
        Column("dtype", "str", "fp32 | fp16 | bf16 (element type of the tensors)"),
        Column("warp_size", "int", "threads per warp / wavefront"),
        Column("num_warps", "int", "warps (wavefronts) per block; for HIP sources, at the launch bound"),
        Column("threads", "int", "threads per block (workgroup)"),
        Column("registers", "int", "vector registers per thread: VGPRs (+AGPRs) on AMD, registers on NVIDIA"),
        Column("sgprs", "int", "scalar registers per wavefront (AMD only)"),
        Column("spilled_regs", "int", "registers spilled: AMD VGPR+SGPR spill counts; NVIDIA spill-store bytes/4"),
        Column("scratch_bytes", "int", "scratch (private / local stack) memory per thread, bytes"),
        Column("lds_bytes", "int", "LDS / shared memory per block, bytes"),
        Column("unit", "str", "what occupancy counts per: SM (NVIDIA), CU (CDNA), WGP (RDNA, WGP mode)"),
        Column("warps_per_unit", "int", "resident warps (waves) per unit, from registers, LDS and the arch's limits"),
        Column("max_warps_per_unit", "int", "the arch's maximum resident warps (waves) per unit"),
        Column("occupancy", "float", "warps_per_unit / max_warps_per_unit"),
        Column("occupancy_limiter", "str", "registers | shared memory | warps | blocks"),
        Column("code_bytes", "int", "machine code size of the kernel, bytes"),
        Column("compile_s", "float", "wall seconds of the cold compile (HIP: the whole translation unit); "
               "a job runs one compile per core it may use, side by side"),
        Column("cached", "bool", "the outcome was reused from .cache/kernel_compile (same source, compiler, target)"),
    ),
    path="build/kernel_resources.csv",
)


def aggregate(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Per-arch tables concatenated, in the order given, with the schema's column types (CSV reading
    turns integer columns with empty cells into floats)."""
    frames = [KERNEL_RESOURCES.read(p) for p in paths]
    if not frames:
        return KERNEL_RESOURCES.frame([])
    table = pd.concat(frames, ignore_index=True)[KERNEL_RESOURCES.names]
    return KERNEL_RESOURCES.frame(table.astype(object).where(table.notna(), None).to_dict("records"))

