"""Every kernel launch the benchmark can make, as (kernel, signature, constexprs, num_warps), per target, and
the LLM fast engine's decode kernels (and its prompts' RoPE), for ``gpulab.toolchains`` to compile ahead of time.

Derived from the functions the launchers call, so the table describes what runs. The signature models a typical
launch: 16-byte aligned tensors, sizes and row strides multiples of 16, and on AMD tensors under 2 GiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from .aot import DTYPES, Launch, elementwise_launches
from .config import Target, needs_64bit_offsets
from .decode_attention import (
    PREFILL_ROPE_TOKENS,
    decode_attention_combine_kernel,
    decode_attention_kernel,
    launch_constexprs,
    prefill_rope_kernel,
)
from .gemv import CONFIGS as GEMV_CONFIGS
from .gemv import flags as gemv_flags
from .gemv import gemv_kernel

# The LLM decode kernels at Qwen2.5-7B's shapes (28 query heads over 4 KV heads of 128, a 640-position cache), in
# bf16: each product's fused form (Q/K/V: norm and bias; O and down: residual; gate/up: norm and activation) at
# one tile config (the others differ in tile sizes only), and the attention pair.
LLM_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM, LLM_CACHE = 28, 4, 128, 640
GEMV_FORMS = {"qkv": gemv_flags(bias=True, eps=1e-6), "o_down": gemv_flags(residual=True),
              "gate_up": gemv_flags(gated=True, eps=1e-6)}


def _llm_decode() -> list[Launch]:
    pointers = dict.fromkeys(("x_ptr", "w_ptr", "b_ptr", "r_ptr", "norm_ptr", "y_ptr"), "*bf16")
    config = next(c for c in GEMV_CONFIGS if (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps) == (4, 512, 4))
    tiles = " ".join(f"{k}={v}" for k, v in config.kwargs.items()) + f" num_warps={config.num_warps}"
    out = []
    for form, fused in GEMV_FORMS.items():
        constexprs = {**fused, **config.kwargs}
        out.append(Launch(op="llm_decode", kernel=gemv_kernel.fn, variant=f"{form} {tiles}", dtype="bf16",
                          signature=pointers | {"N": "i32", "K": "i32"} | dict.fromkeys(constexprs, "constexpr"),
                          constexprs=constexprs, num_warps=config.num_warps))
    rope, attend, combine = launch_constexprs(LLM_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM, LLM_CACHE)
    partials = {"part_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
    rows = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr"), "*bf16")
    split = f"CHUNK={attend['CHUNK']} SPLITS={attend['SPLITS']}"
    rope_args = {**dict.fromkeys(("qkv_ptr", "cos_ptr", "sin_ptr"), "*bf16"), **rows, "pos_ptr": "*i64",
                 "max_len": "i32", "tokens": "i32"}
    for kernel, signature, constexprs, variant, warps in (
        (prefill_rope_kernel, rope_args, {**rope, "BLOCK_T": PREFILL_ROPE_TOKENS},
         f"HEADS={LLM_HEADS} KV_HEADS={LLM_KV_HEADS} BLOCK_T={PREFILL_ROPE_TOKENS}", 4),
        (decode_attention_kernel, {**dict.fromkeys(("qkv_ptr", "cos_ptr", "sin_ptr", "k_ptr", "v_ptr"), "*bf16"),
                                   "pos_ptr": "*i64", **partials, "max_len": "i32"}, attend, split, 4),
        (decode_attention_combine_kernel, {**partials, "pos_ptr": "*i64", "o_ptr": "*bf16"}, combine, split, 4),
    ):
        out.append(Launch(op="llm_decode", kernel=kernel, variant=f"{variant} num_warps={warps}", dtype="bf16",
                          signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs,
                          num_warps=warps))
    return out


def op_launches(op: str, kernels: ModuleType, dtype: str, target: Target, offsets: tuple[bool, ...]) -> list[Launch]:
    """The launches of one op's kernel module: its own ``aot_launches``, or those of its elementwise ``<op>_kernel``."""
    if hasattr(kernels, "aot_launches"):
        return kernels.aot_launches(dtype, target)
    return elementwise_launches(op, getattr(kernels, f"{op}_kernel").fn, dtype, target, offsets)


def launches(target: Target, dtypes: tuple[str, ...], vector_elements: tuple[int, ...],
             kernels: Mapping[str, ModuleType] | None = None) -> list[Launch]:
    """Every launch of the ops' Triton kernels (``kernels``, op -> kernel module; default: every registered op's)
    for ``target``'s family, per dtype, for elementwise tensors of the given sizes (they decide whether the
    64-bit-offset variant is launched)."""
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; Triton kernels are compiled for {sorted(DTYPES)}")
    if kernels is None:
        from gpulab.core.ops import triton_kernels

        kernels = triton_kernels()
    offsets = tuple(sorted({needs_64bit_offsets(n) for n in vector_elements}))
    out = []
    for dtype in dtypes:
        for op, module in kernels.items():
            out += op_launches(op, module, dtype, target, offsets)
    return out + _llm_decode()
