"""A kernel launch as the ahead-of-time compile table describes it (``gpulab.toolchains``), and the launches of
an elementwise kernel: its family's autotune list, with 64-bit offsets where the benchmark's sizes need them.

A kernel module that picks its own launches defines ``aot_launches(dtype, target)`` (softmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Target, elementwise_shapes

DTYPES = {"fp32": ("fp32", 4), "fp16": ("fp16", 2), "bf16": ("bf16", 2)}


@dataclass(frozen=True)
class Launch:
    op: str  # the benchmark's op (gpulab.core.ops), or llm_decode
    kernel: Any  # the @triton.jit function
    variant: str  # its launch parameters, e.g. "BLOCK_SIZE=2048 num_warps=16 OFFSETS_64=0"
    dtype: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int

    def attrs(self, backend: str) -> dict[tuple[int, ...], list[list[Any]]]:
        """Triton's specialisation attributes for the typical launch (see gpulab.kernels.triton.launches)."""
        names = list(self.signature)
        small = not self.constexprs.get("OFFSETS_64", False)
        attrs = {}
        for i, name in enumerate(names):
            kind = self.signature[name]
            if kind == "constexpr":
                continue
            attr = [["tt.divisibility", 16]]
            if kind.startswith("*") and backend == "hip" and small:
                attr.append(["tt.pointer_range", 32])
            attrs[(i,)] = attr
        return attrs


def elementwise_launches(op: str, kernel: Any, dtype: str, target: Target, offsets: tuple[bool, ...]) -> list[Launch]:
    """Every launch of an elementwise kernel (the @triton.jit function): its ``*_ptr`` arguments are tensors of
    ``dtype``, ``n_elements`` 32- or 64-bit as ``offsets`` say."""
    ty = DTYPES[dtype][0]
    pointers = [name for name in kernel.arg_names if name.endswith("_ptr")]
    launches = []
    for block, warps in elementwise_shapes(target):
        for wide in offsets:
            signature = {p: f"*{ty}" for p in pointers} | {"n_elements": "i64" if wide else "i32"}
            signature |= {"OFFSETS_64": "constexpr", "BLOCK_SIZE": "constexpr"}
            launches.append(Launch(
                op=op, kernel=kernel, variant=f"BLOCK_SIZE={block} num_warps={warps} OFFSETS_64={int(wide)}",
                dtype=dtype, signature=signature, constexprs={"OFFSETS_64": wide, "BLOCK_SIZE": block},
                num_warps=warps))
    return launches
