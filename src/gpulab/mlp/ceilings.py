"""The MLP's own matmul ceilings (mlp/ceilings.csv): at its GEMM shapes and on the path its products take.

Measured by the MLP's step, so the MLP's settings never re-measure the benchmark matrix's ceilings, and kept apart
from :mod:`gpulab.core.ceilings` so a benchmark cell's code does not include the MLP's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpulab.core.ceilings import (
    CEILINGS,
    Gemm,
    ceiling_rate,
    mark_best,
    matmul_modes,
    measure_matmul,
    timed_row,
    with_state,
)
from gpulab.core.device import DeviceInfo, detect
from gpulab.core.timing import TimingSettings
from gpulab.mlp.model import VARIANTS, MLPShape, matmul_flops

# The MLP's own matmul ceilings: the ceilings table's columns, beside the benchmark matrix's.
MLP_CEILINGS = replace(CEILINGS, path="mlp/ceilings.csv")


def measure_gemm_ceilings(dtypes: Sequence[str], gemms: Sequence[Gemm], timing: TimingSettings, *, target: str,
                          fingerprint: str, mlp: MLPShape | None = None,
                          device: DeviceInfo | None = None) -> list[dict[str, Any]]:
    """The matmul ceiling at a workload's own GEMM shapes only (the MLP's, measured by its own step), and on the
    MLP's own path (``mlp``: its shape; measure_mlp_path): a workload's settings then never re-measure the
    benchmark matrix's ceilings (``CEILINGS.path``)."""
    info = device or detect()
    modes = matmul_modes(dtypes, info)
    rows = measure_matmul(modes, gemms, timing, info, squares=False)
    if mlp is not None:
        rows += measure_mlp_path(modes, mlp, timing, info)
    return [{"target": target, "fingerprint": fingerprint, **row} for row in mark_best(rows)]


def measure_mlp_path(modes: Sequence[str], shape: MLPShape, timing: TimingSettings,
                     info: DeviceInfo) -> list[dict[str, Any]]:
    """The matmul ceiling on the path the MLP's products take: its stack of Linear layers without the activations,
    forward and backward, in each eager MLP variant's precision (TF32 on or off, bf16 autocast over fp32 weights,
    the casts included, or bf16 weights). The stack does exactly the step's products (no input gradient for the
    first layer) and nothing else, so no variant should beat its row. One layer is not that path: where the input
    gradient's product is the slow one (bf16 on a CPU without bf16 units: 12 times the forward's), a layer does
    it for each of its three products, the MLP for fewer of them."""
    import torch

    rows = []
    for variant in VARIANTS.values():
        if variant.graph or variant.compiled or variant.ceiling_dtype not in modes or variant.unavailable(info):
            continue
        dtype = torch.bfloat16 if variant.bf16_weights else torch.float32
        stack = torch.nn.Sequential(*(torch.nn.Linear(shape.dim, shape.dim) for _ in range(shape.num_layers)))
        stack = stack.to(device=info.torch_device, dtype=dtype)
        x = torch.randn(shape.batch, shape.dim, device=info.torch_device, dtype=dtype)
        out_dtype = torch.bfloat16 if variant.bf16_weights or variant.autocast_bf16 else torch.float32
        grad = torch.randn(shape.batch, shape.dim, device=info.torch_device, dtype=out_dtype)

        def step(stack: Any = stack, x: Any = x, grad: Any = grad, variant: Any = variant) -> None:
            stack.zero_grad(set_to_none=True)
            with variant.autocast(info):
                out = stack(x)
            out.backward(grad)

        with variant.matmul_precision():
            row = with_state(info, lambda step=step: [timed_row([step], timing, info)])[0]
        rows.append({"kind": "matmul", "dtype": variant.ceiling_dtype, "size": f"{shape.batch}x{shape.dim}x{shape.dim}",
                     "method": f"linear stack fwd+bwd, {shape.num_layers} layers ({variant.name})", **row,
                     "tflops": ceiling_rate(matmul_flops(shape), row, 1e12)})
    return rows
