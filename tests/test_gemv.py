"""Triton's fused matrix-vector products (kernels/triton/gemv.py), every tile config, in Triton's interpreter
on a CPU against float64 products: plain, with bias and residual, and the gated (SwiGLU) form with and
without the RMS norm; row and column counts that are not multiples of the tiles; the prefill's silu·up. On a
GPU the fast engine's teacher-forcing check covers them."""

import os
import subprocess
import sys

import pytest

CODE = """
import torch, torch.nn.functional as F
from gpulab.kernels.triton.gemv import CONFIGS, gemv, silu_mul

torch.manual_seed(0)
for dtype, bound in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    for shape in ((1, 5, 2 * 3000), (3, 2 * 10)):
        x = torch.randn(*shape).to(dtype)
        gate, up = x.double().chunk(2, dim=-1)
        ref = F.silu(gate) * up
        y = silu_mul(x)
        assert y.dtype == dtype and y.shape == ref.shape
        assert ((y.double() - ref).norm() / ref.norm()).item() < bound, ("silu_mul", dtype, shape)
for dtype, bound in ((torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)):
    for config in CONFIGS:
        for n, k in ((100, 300), (37, 1000)):
            x = torch.randn(1, 1, k).to(dtype)
            w = (torch.randn(n, k) / k ** 0.5).to(dtype)
            b, r = torch.randn(n).to(dtype), torch.randn(1, 1, n).to(dtype)
            y = gemv(x, w, b, r, config=config)
            ref = r.double() + F.linear(x.double(), w.double(), b.double())
            assert y.dtype == dtype and y.shape == (1, 1, n)
            assert ((y.double() - ref).norm() / ref.norm()).item() < bound, (dtype, config, n, k)
            w2 = (torch.randn(2 * n, k) / k ** 0.5).to(dtype)
            gate, up = F.linear(x.double(), w2.double()).chunk(2, dim=-1)
            ref = F.silu(gate) * up
            y = gemv(x, w2, gated=True, config=config)
            assert ((y.double() - ref).norm() / ref.norm()).item() < bound, ("gated", dtype, config, n, k)
            nw = (1 + torch.randn(k) / 4).to(dtype)
            h = x.double() * torch.rsqrt(x.double().pow(2).mean() + 1e-6) * nw.double()
            gate, up = F.linear(h, w2.double()).chunk(2, dim=-1)
            y = gemv(x, w2, gated=True, norm=(nw, 1e-6), config=config)
            ref = F.silu(gate) * up
            assert ((y.double() - ref).norm() / ref.norm()).item() < bound, ("norm", dtype, config, n, k)
"""


def _interpreter_takes_runtime_loop_bounds() -> bool:
    """Triton's interpreter before 3.9 turns a runtime loop bound (``range(0, K, BLOCK_K)``) into an index with
    int() on a one-element array: a TypeError since NumPy 2.4 (Triton 3.6, the GPU machine's, fails this way;
    with NumPy 2.2 the same test passes there)."""
    import numpy
    import triton

    def version(module):
        return tuple(int(p) for p in module.__version__.split(".")[:2])

    return version(triton) >= (3, 9) or version(numpy) < (2, 4)


@pytest.mark.slow
@pytest.mark.skipif(not _interpreter_takes_runtime_loop_bounds(),
                    reason="this Triton's interpreter cannot run a runtime loop bound under NumPy >= 2.4")
def test_every_config_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def test_shapes_it_cannot_take_are_refused():
    import torch

    from gpulab.kernels.triton.gemv import gemv

    with pytest.raises(ValueError, match="one row of 64 values"):
        gemv(torch.zeros(2, 64), torch.zeros(8, 64))
    with pytest.raises(ValueError, match="even row count"):
        gemv(torch.zeros(1, 64), torch.zeros(7, 64), gated=True)
    with pytest.raises(ValueError, match="bias of 3 values for 8 outputs"):
        gemv(torch.zeros(1, 64), torch.zeros(8, 64), bias=torch.zeros(3))
    with pytest.raises(ValueError, match="norm weight of 3 values for 64 inputs"):
        gemv(torch.zeros(1, 64), torch.zeros(8, 64), norm=(torch.zeros(3), 1e-6))
    with pytest.raises(ValueError, match="contiguous weight"):
        gemv(torch.zeros(1, 64), torch.zeros(64, 8).t())


def test_the_decode_products_compile_from_the_config_alone_touching_no_memory(monkeypatch):
    """Before its job claims the device, the fast engine compiles the five products from the model's dimensions:
    meta tensors give the shapes, Triton's warmup gets dtypes for pointers, and each product's sizes and flags are
    those of the step's own launch."""
    import torch

    from gpulab.kernels.triton import gemv
    from gpulab.kernels.triton.config import Target
    from gpulab.llm import qwen2

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calls = []
    monkeypatch.setattr(gemv.gemv_kernel, "warmup", lambda *args, grid, **meta: calls.append((args, meta)))
    dims = qwen2.Dims(n_layers=28, n_heads=28, n_kv=4, head_dim=128, hidden=3584, intermediate=18944,
                      vocab=152064, eps=1e-6)
    qwen2.compile_decode_products(dims, torch.bfloat16, Target("cuda", 32, "sm_90", 132))
    assert [args[-2:] for args, _ in calls] == [(4608, 3584), (3584, 3584), (18944, 3584), (3584, 18944),
                                                 (152064, 3584)]
    assert all(isinstance(a, (torch.dtype, int)) for args, _ in calls for a in args)
    assert all(meta["PDL"] and meta["launch_pdl"] for _, meta in calls)
    assert [(m["HAS_BIAS"], m["HAS_RESIDUAL"], m["GATED"], m["NORM"]) for _, m in calls] == [
        (True, False, False, True), (False, True, False, False), (False, False, True, True),
        (False, True, False, False), (False, False, False, True)]
    calls.clear()
    qwen2.compile_decode_products(dims, torch.bfloat16, Target("hip", 64, "gfx942", 304))
    assert calls and not any(meta["PDL"] or "launch_pdl" in meta for _, meta in calls)
