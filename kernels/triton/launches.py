"""Every kernel launch the benchmark can make, as (kernel, signature, constexprs, num_warps), per target, and
the LLM fast engine's decode kernels.

``gpulab.kernel_compile`` compiles these ahead of time for architectures that are not present. They are
derived from the same functions the launchers call (``elementwise_shapes``, ``softmax.launch_choice``), so
the table describes what runs. The signature models a typical launch: tensors 16-byte aligned, sizes and
row strides multiples of 16 (Triton specialises on both), and on AMD tensors under 2 GiB (buffer
loads) unless 64-bit offsets are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .add import add_kernel
from .config import Target, elementwise_shapes, needs_64bit_offsets, softmax_config
from .decode_attention import (
    decode_attention_combine_kernel,
    decode_attention_kernel,
    decode_rope_kernel,
    launch_constexprs,
)
from .gelu import gelu_kernel
from .gemv import CONFIGS as GEMV_CONFIGS
from .gemv import flags as gemv_flags
from .gemv import gemv_kernel
from .softmax import SoftmaxLaunch, launch_choice, softmax_kernel, softmax_looped_kernel, softmax_split_kernel

DTYPES = {"fp32": ("fp32", 4), "fp16": ("fp16", 2), "bf16": ("bf16", 2)}
# Softmax row widths covered: every power of two the fused kernel takes (16 .. max_fused_cols), then the widest
# row of the benchmark's sizes for the split kernel (its chunk, hence its code, is the same for every SPLIT but
# the partials' load), and the looped kernel's default block. Narrower rows are padded to 16 columns' worth of
# layout anyway.
SOFTMAX_MIN_COLS = 16
SOFTMAX_SPLIT_COLS = 131072
SOFTMAX_ROWS = 1 << 16  # enough rows that rows_per_program is never capped by the tensor's height
# The LLM decode kernels at Qwen2.5-7B's shapes (28 query heads over 4 KV heads of 128, a 640-position cache), in
# bf16: each product's fused form (Q/K/V: norm and bias; O and down: residual; gate/up: norm and activation) at
# one tile config (the others differ in tile sizes only), and the attention pair.
LLM_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM, LLM_CACHE = 28, 4, 128, 640
GEMV_FORMS = {"qkv": gemv_flags(bias=True, eps=1e-6), "o_down": gemv_flags(residual=True),
              "gate_up": gemv_flags(gated=True, eps=1e-6)}


@dataclass(frozen=True)
class Launch:
    op: str  # the benchmark's op: gelu | softmax | add
    kernel: Any  # the @triton.jit function
    variant: str  # its launch parameters, e.g. "BLOCK_SIZE=2048 num_warps=16 OFFSETS_64=0"
    dtype: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int

    def attrs(self, backend: str) -> dict[tuple[int, ...], list[list[Any]]]:
        """Triton's specialisation attributes for the typical launch (see the module docstring)."""
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


def _elementwise(op: str, kernel: Any, dtype: str, target: Target, offsets: tuple[bool, ...]) -> list[Launch]:
    ty = DTYPES[dtype][0]
    pointers = ("x_ptr", "y_ptr", "output_ptr") if op == "add" else ("x_ptr", "y_ptr")
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


def _softmax(dtype: str, target: Target) -> list[Launch]:
    _, itemsize = DTYPES[dtype]
    config = softmax_config(target)
    widths = [SOFTMAX_MIN_COLS << k for k in range((config.max_fused_cols // SOFTMAX_MIN_COLS).bit_length())]
    choices = [launch_choice(SOFTMAX_ROWS, width, itemsize, target) for width in [*widths, SOFTMAX_SPLIT_COLS]]
    choices.append(launch_choice(SOFTMAX_ROWS, SOFTMAX_SPLIT_COLS, itemsize, target,
                                 looped_block=config.looped_block(itemsize)))
    launches = [_softmax_launch(choice, dtype) for choice in choices]
    return list({(launch.kernel, launch.variant): launch for launch in launches}.values())


def _softmax_launch(choice: SoftmaxLaunch, dtype: str) -> Launch:
    ty = DTYPES[dtype][0]
    pointers = {"x_ptr": f"*{ty}", "y_ptr": f"*{ty}"}
    strides = ("n_cols", "x_row_stride", "y_row_stride")
    if choice.kernel == "split":
        kernel, ints = softmax_split_kernel, strides
        pointers |= {"ticket_ptr": "*i32", "count_ptr": "*i32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
        constexprs = {"SPLIT": choice.split, "BLOCK_N": choice.block_n}
    elif choice.kernel == "looped":
        kernel, ints, constexprs = softmax_looped_kernel, strides, {"BLOCK_N": choice.block_n}
    else:
        kernel, ints = softmax_kernel, ("n_rows", *strides)
        constexprs = {"BLOCK_M": choice.block_m, "BLOCK_N": choice.block_n}
    signature = pointers | dict.fromkeys(ints, "i32") | dict.fromkeys(constexprs, "constexpr")
    variant = " ".join(f"{k}={v}" for k, v in constexprs.items()) + f" num_warps={choice.num_warps}"
    return Launch(op="softmax", kernel=kernel, variant=variant, dtype=dtype, signature=signature,
                  constexprs=constexprs, num_warps=choice.num_warps)


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
    for kernel, signature, constexprs, variant, warps in (
        (decode_rope_kernel, {**dict.fromkeys(("qkv_ptr", "cos_ptr", "sin_ptr"), "*bf16"), **rows, "pos_ptr": "*i64",
                              "max_len": "i32"}, rope, f"HEADS={LLM_HEADS} KV_HEADS={LLM_KV_HEADS}", 1),
        (decode_attention_kernel, {**rows, "pos_ptr": "*i64", **partials, "max_len": "i32"}, attend, split, 4),
        (decode_attention_combine_kernel, {**partials, "pos_ptr": "*i64", "o_ptr": "*bf16"}, combine, split, 4),
    ):
        out.append(Launch(op="llm_decode", kernel=kernel, variant=f"{variant} num_warps={warps}", dtype="bf16",
                          signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs,
                          num_warps=warps))
    return out


def launches(target: Target, dtypes: tuple[str, ...], vector_elements: tuple[int, ...]) -> list[Launch]:
    """Every launch of gelu, softmax and add for ``target``'s family, per dtype, for elementwise tensors of
    the given sizes (they decide whether the 64-bit-offset variant is launched)."""
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; Triton kernels are compiled for {sorted(DTYPES)}")
    offsets = tuple(sorted({needs_64bit_offsets(n) for n in vector_elements}))
    out = []
    for dtype in dtypes:
        out += _elementwise("gelu", gelu_kernel.fn, dtype, target, offsets)
        out += _softmax(dtype, target)
        out += _elementwise("add", add_kernel.fn, dtype, target, offsets)
    return out + _llm_decode()
