"""Triton's split-KV decode attention (kernels/triton/decode_attention.py), RoPE and the cache write included,
against RoPE in float64 and SDPA over the masked cache:
in Triton's interpreter on a CPU (float32 and float16: the interpreter's tl.dot mishandles bfloat16), and on a
GPU in every dtype when one is present (the fast engine's teacher-forcing check covers it in the workflow)."""

import os
import subprocess
import sys

import pytest

# (heads, kv heads, head size, cache length, position): a 7B model's grouped heads at the first, a middle and
# the last position; a ragged last chunk; one chunk past the split limit (64 chunks of 64 positions); the smallest
# head size.
CASES = [(28, 4, 128, 640, 0), (28, 4, 128, 640, 129), (28, 4, 128, 640, 639), (4, 2, 64, 96, 50),
         (8, 8, 32, 4096, 3000), (4, 2, 16, 64, 37)]

COMPARE = """
import torch, torch.nn.functional as F
from gpulab.kernels.triton.decode_attention import decode_attention, decode_split

def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

def compare(heads, kv, d, max_len, pos, dtype, device):
    gen = torch.Generator(device=device).manual_seed(pos)
    qkv = (torch.randn(1, 1, (heads + 2 * kv) * d, generator=gen, device=device) * 3).to(dtype)
    angle = torch.rand(1, d // 2, generator=gen, device=device) * 6.3
    cos, sin = angle.cos().repeat(1, 2).to(dtype), angle.sin().repeat(1, 2).to(dtype)
    k = (torch.randn(1, kv, max_len, d, generator=gen, device=device) * 3).to(dtype)
    v = torch.randn(1, kv, max_len, d, generator=gen, device=device).to(dtype)
    # positions from pos on hold garbage: pos is the kernel's to write, later ones must not be read
    k[:, :, pos:] = float("nan")
    v[:, :, pos:] = float("nan")
    out = decode_attention(qkv, cos, sin, k, v, torch.tensor([pos], device=device), heads)
    q_raw, k_raw, v_raw = qkv.double().split([heads * d, kv * d, kv * d], dim=-1)
    q = rope(q_raw.view(1, heads, 1, d), cos.double(), sin.double())
    k_new = rope(k_raw.view(1, kv, 1, d), cos.double(), sin.double())
    # the cache holds the new row rotated (in float32, rounded once to its dtype) and v as it came
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(k[:, :, pos:pos + 1].double(), k_new, rtol=ulp, atol=16 * ulp)  # inputs up to ~15
    assert torch.equal(v[:, :, pos], v_raw.view(1, kv, d).to(dtype))
    assert not k[:, :, pos + 1:].isfinite().any(), "a row past pos was written"
    mask = (torch.arange(max_len, device=device) <= pos).view(1, -1)
    g = heads // kv
    ref = F.scaled_dot_product_attention(q.view(1, kv, g, d), k.double().nan_to_num(), v.double().nan_to_num(),
                                         attn_mask=mask).reshape(1, 1, heads * d)
    assert out.dtype == dtype and out.shape == (1, 1, heads * d)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    bound = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert err < bound, (heads, kv, d, max_len, pos, dtype, err, decode_split(max_len))
"""


PROMPT = """
import torch
from gpulab.kernels.triton.decode_attention import rope_into_cache

def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

heads, kv, d, max_len = 4, 2, 32, 48
for tokens, dtype in ((5, torch.float32), (5, torch.float16), (1, torch.float32), (37, torch.float16)):
    qkv = (torch.randn(1, tokens, (heads + 2 * kv) * d) * 3).to(dtype)
    angle = torch.rand(tokens, d // 2) * 6.3
    cos, sin = angle.cos().repeat(1, 2).to(dtype), angle.sin().repeat(1, 2).to(dtype)
    k, v = torch.full((1, kv, max_len, d), float("nan"), dtype=dtype), torch.full((1, kv, max_len, d), float("nan"),
                                                                                   dtype=dtype)
    q = rope_into_cache(qkv, cos, sin, k, v, torch.arange(tokens), heads)
    q_raw, k_raw, v_raw = qkv.double().split([heads * d, kv * d, kv * d], dim=-1)
    ulp = torch.finfo(dtype).eps
    expect_q = rope(q_raw.view(1, tokens, heads, d).transpose(1, 2), cos.double(), sin.double())
    expect_k = rope(k_raw.view(1, tokens, kv, d).transpose(1, 2), cos.double(), sin.double())
    assert q.shape == (1, tokens, heads, d) and q.dtype == dtype
    torch.testing.assert_close(q.transpose(1, 2).double(), expect_q, rtol=ulp, atol=16 * ulp)
    torch.testing.assert_close(k[:, :, :tokens].double(), expect_k, rtol=ulp, atol=16 * ulp)
    assert torch.equal(v[:, :, :tokens], v_raw.view(1, tokens, kv, d).transpose(1, 2).to(dtype))
    assert not k[:, :, tokens:].isfinite().any() and not v[:, :, tokens:].isfinite().any()
"""


def test_a_prompts_rope_and_cache_write_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", PROMPT], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_split_kv_in_the_interpreter():
    code = COMPARE + f"""
for case in {CASES!r}:
    for dtype in (torch.float32, torch.float16):
        compare(*case, dtype, "cpu")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def test_chunks_cover_the_cache_within_the_split_limit():
    from gpulab.kernels.triton.decode_attention import BLOCK_N, MAX_SPLITS, decode_split

    for max_len in (1, 31, 32, 640, 4096, 4097, 131072):
        chunk, splits = decode_split(max_len)
        assert chunk % BLOCK_N == 0 and splits <= MAX_SPLITS and (splits - 1) * chunk < max_len <= splits * chunk


def test_shapes_the_kernel_cannot_take_are_refused():
    import torch

    from gpulab.kernels.triton.decode_attention import decode_attention

    cache, rot, pos = torch.zeros(1, 4, 64, 128), torch.zeros(1, 128), torch.tensor([3])
    with pytest.raises(ValueError, match="one token's contiguous q/k/v row"):
        decode_attention(torch.zeros(1, 2, 36 * 128), rot, rot, cache, cache, pos, 28)
    with pytest.raises(ValueError, match="one token's contiguous q/k/v row"):
        decode_attention(torch.zeros(1, 1, 2 * 36 * 128)[..., ::2], rot, rot, cache, cache, pos, 28)
    with pytest.raises(ValueError, match="power-of-two head size"):
        small, rot = torch.zeros(1, 4, 64, 80), torch.zeros(1, 80)
        decode_attention(torch.zeros(1, 1, 36 * 80), rot, rot, small, small, pos, 28)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_split_kv_on_the_gpu(dtype):
    import torch

    namespace: dict = {}
    exec(COMPARE, namespace)
    for case in CASES:
        namespace["compare"](*case, getattr(torch, dtype), "cuda")


@pytest.mark.slow
def test_the_attention_operator_passes_torchs_operator_checks_in_the_interpreter():
    """``torch.ops.gpulab_llm.split_kv_attention``, what the compiled decode step calls: torch.library.opcheck
    runs it against its schema (the cache writes declared, nothing else written), its fake (the output's shape
    and dtype without running) and compiled dispatch."""
    code = """
import torch
from gpulab.llm import qwen2

heads, kv, d, max_len, pos = 4, 2, 64, 96, 50
gen = torch.Generator().manual_seed(0)
qkv = torch.randn(1, 1, (heads + 2 * kv) * d, generator=gen)
cos, sin = torch.randn(1, d, generator=gen), torch.randn(1, d, generator=gen)
k, v = torch.randn(1, kv, max_len, d, generator=gen), torch.randn(1, kv, max_len, d, generator=gen)
op = torch.ops.gpulab_llm.split_kv_attention.default
torch.library.opcheck(op, (qkv, cos, sin, k, v, torch.tensor([pos]), heads))
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_decode_operators_declare_their_writes_and_shapes():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpulab.llm import qwen2  # noqa: F401 - registers the operators

    writes = {name: [a.name for a in getattr(torch.ops.gpulab_llm, name).default._schema.arguments
                     if a.alias_info is not None and a.alias_info.is_write]
              for name in ("gemv", "split_kv_attention")}
    assert writes == {"gemv": [], "split_kv_attention": ["cache_k", "cache_v"]}
    with FakeTensorMode():
        x, w13, wd = torch.empty(1, 1, 64), torch.empty(2 * 96, 64), torch.empty(64, 96)
        gated = torch.ops.gpulab_llm.gemv(x, w13, None, None, torch.empty(64), 1e-6, True)
        assert gated.shape == (1, 1, 96)
        assert torch.ops.gpulab_llm.gemv(gated, wd, None, x, None, 0.0, False).shape == (1, 1, 64)
        cache = torch.empty(1, 2, 32, 16)
        out = torch.ops.gpulab_llm.split_kv_attention(torch.empty(1, 1, 8 * 16), torch.empty(1, 16),
                                                      torch.empty(1, 16), cache, cache, torch.empty(1), 4)
        assert out.shape == (1, 1, 4 * 16)
