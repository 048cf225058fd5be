"""Dtype names used in config and CSVs, and their torch dtypes and sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("fp32", "fp16", "bf16")
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


def torch_dtype(name: str) -> torch.dtype:
    import torch

    try:
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}") from None
