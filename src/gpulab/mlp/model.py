"""The study's MLP, its sizes, its matmul FLOP count and the precision variants it is profiled in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpulab.core.device import DeviceInfo

# "auto" sizes: the study's GPU run, and a CPU size that keeps CI fast.
GPU_SHAPE = {"dim": 2048, "num_layers": 64, "batch": 1024}
CPU_SHAPE = {"dim": 256, "num_layers": 4, "batch": 64}


class MLP(nn.Module):
    """``Linear -> GeLU`` repeated ``num_layers`` times, all layers ``dim x dim`` (as in the study)."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, dim) for _ in range(num_layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return x


@dataclass(frozen=True)
class MLPShape:
    dim: int
    num_layers: int
    batch: int
    num_steps: int


def resolve_shape(config: Mapping[str, Any], info: DeviceInfo) -> MLPShape:
    """Sizes from the ``mlp`` config section, where "auto" takes the study's size on a GPU, a tiny one on CPU."""
    defaults = GPU_SHAPE if info.gpu_available else CPU_SHAPE
    values = {}
    for key, default in defaults.items():
        value = config.get(key, "auto")
        values[key] = default if value == "auto" else int(value)
        if values[key] < 1:
            raise ValueError(f"mlp.{key} must be a positive integer or 'auto', got {value!r}")
    steps = int(config.get("num_steps", 5))
    if steps < 1:
        raise ValueError(f"mlp.num_steps must be >= 1, got {steps}")
    return MLPShape(num_steps=steps, **values)


def gemm_shapes(shape: MLPShape) -> list[tuple[int, int, int]]:
    """(M, N, K) of the step's products: forward and input gradient (B x D x D), weight gradient (D x D x B)."""
    return [(shape.batch, shape.dim, shape.dim), (shape.dim, shape.dim, shape.batch)]


def matmul_flops(shape: MLPShape) -> int:
    """Matmul FLOPs of one forward+backward step (bias adds and activations are not counted).

    Each layer's forward is one ``batch x dim x dim`` product (2·B·D² FLOPs). Backward computes the
    weight gradient of every layer and the input gradient of every layer but the first: the input
    ``x`` does not require grad, so autograd skips that product. Total 2·B·D²·(3L - 1).
    """
    per_product = 2 * shape.batch * shape.dim * shape.dim
    return per_product * (3 * shape.num_layers - 1)


@dataclass(frozen=True)
class Variant:
    """How one profiled step runs: matmul precision, autocast or bf16 weights, compilation or one device graph
    per step, and what it is checked to."""

    name: str
    ceiling_dtype: str  # the matmul ceiling row (gpulab.core.ceilings) this variant is placed against
    description: str
    allow_tf32: bool = False
    autocast_bf16: bool = False
    # The model's parameters and input in bfloat16 (no autocast): no per-step casts of the weights.
    bf16_weights: bool = False
    compiled: bool = False
    # The whole forward+backward step captured once in a CUDA/HIP graph and replayed: one launch per step.
    graph: bool = False
    # Relative L2 error against a float64 reference: fp32 arithmetic stays far below 1e-4; TF32 keeps
    # 10 mantissa bits and bf16 8, and the error of 64 layers adds up, hence the looser bounds.
    tolerance: float = 1e-4

    def unavailable(self, info: DeviceInfo) -> str | None:
        """Why this variant cannot run on the device, or None."""
        if self.allow_tf32 and info.backend != "cuda":
            if info.backend == "rocm":
                return "TF32 is a CUDA matmul mode; ROCm has no TF32 (PyTorch HIP semantics)"
            return f"TF32 is a CUDA matmul mode; this target has no CUDA GPU ({info.reason or info.backend})"
        if self.graph and not info.gpu_available:
            return f"CUDA/HIP graphs need a GPU; this target has none ({info.reason or info.backend})"
        return None

    @contextlib.contextmanager
    def matmul_precision(self) -> Iterator[None]:
        """TF32 on or off for the duration (the flag is process-global, so it is restored afterwards)."""
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous

    def autocast(self, info: DeviceInfo) -> contextlib.AbstractContextManager[Any]:
        if not self.autocast_bf16:
            return contextlib.nullcontext()
        # Autocast's cache of cast weights must be off inside a graph capture (PyTorch's CUDA graphs notes).
        return torch.autocast(device_type=info.torch_device, dtype=torch.bfloat16, cache_enabled=not self.graph)


_BF16 = 5e-2
_TF32 = 2e-2
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("fp32", "fp32", "fp32, TF32 off"),
        Variant("tf32", "tf32", "fp32 with TF32 matmuls (CUDA only)", allow_tf32=True, tolerance=_TF32),
        Variant("bf16", "bf16", "fp32 weights, bf16 autocast", autocast_bf16=True, tolerance=_BF16),
        Variant("compiled", "fp32", "torch.compile of the model, fp32", compiled=True),
        Variant("tf32_graph", "tf32", "tf32, whole step replayed as one CUDA/HIP graph", allow_tf32=True,
                graph=True, tolerance=_TF32),
        Variant("bf16_graph", "bf16", "bf16 autocast, whole step replayed as one CUDA/HIP graph",
                autocast_bf16=True, graph=True, tolerance=_BF16),
        Variant("bf16_weights", "bf16", "bf16 weights and input, no autocast", bf16_weights=True, tolerance=_BF16),
        Variant("bf16_weights_graph", "bf16", "bf16 weights, whole step replayed as one CUDA/HIP graph",
                bf16_weights=True, graph=True, tolerance=_BF16),
    )
}


def ceiling_dtypes(variants: Sequence[str]) -> list[str]:
    """The dtypes whose matmul ceiling the variants are placed against (TF32 is fp32's CUDA mode: measured with it,
    :func:`gpulab.core.ceilings.matmul_modes`)."""
    return sorted({"fp32" if VARIANTS[v].ceiling_dtype == "tf32" else VARIANTS[v].ceiling_dtype
                   for v in variants if v in VARIANTS})
