"""The five implementations every op of the registry (:mod:`gpulab.core.ops`) has, each derived from its entry.

``manual`` (the study's unfused PyTorch), ``native`` (PyTorch's fused op, the baseline), ``cpp_ext`` (the C++
extension's ``torch.ops.gpulab.<ext_op>``), ``triton`` (``kernels/triton/<op>.py``) and ``torch_compile`` (of
``manual``), each registered with its :class:`~gpulab.bench.registry.Implementation` facts. An op without an extension
op or Triton kernels records those cells as skipped.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpulab.bench.registry import REGISTRY, BenchContext, Case, Implementation, Unavailable, register_kind
from gpulab.core.compiled import static_compile
from gpulab.core.device import DeviceInfo
from gpulab.core.ops import op_spec

if TYPE_CHECKING:
    import torch

Closure = Callable[[], "torch.Tensor"]


def _bind(fn: Callable[..., torch.Tensor], args: Sequence[Any]) -> Closure:
    """The closure the benchmark times: ``fn`` applied to the case's tensors."""
    args = tuple(args)
    return lambda: fn(*args)


# ---------------------------------------------------------------- availability


def triton_unavailable(ctx: BenchContext, op: str) -> Unavailable | None:
    """Why the op's Triton kernels cannot run here: none written, no Triton, no GPU, or a module that fails to
    import (cached per op)."""
    key = f"triton:{op}"
    if key in ctx.cache:
        return ctx.cache[key]
    reason: Unavailable | None = None
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    spec = op_spec(op)
    if spec.triton_module is None:
        reason = Unavailable(f"{op} has no Triton kernels")
    elif importlib.util.find_spec("triton") is None:
        reason = Unavailable("Triton is not installed")
    elif not ctx.info.gpu_available and not interpreted:
        reason = Unavailable(f"Triton needs a GPU driver: {ctx.info.reason}")
    else:
        try:
            spec.triton_kernels()
        except Exception as exc:  # a broken Triton install is a recorded outcome, not a crash
            reason = Unavailable(f"Triton kernels failed to import: {type(exc).__name__}: {exc}", "failed")
    ctx.cache[key] = reason
    return reason


def compile_unavailable(ctx: BenchContext, op: str) -> Unavailable | None:
    if "torch_compile" in ctx.cache:
        return ctx.cache["torch_compile"]
    reason: Unavailable | None = None
    if ctx.info.gpu_available:
        if importlib.util.find_spec("triton") is None:
            reason = Unavailable("torch.compile's GPU code generator (inductor) needs Triton, which is not installed")
    else:
        from torch._inductor import config as inductor_config

        compiler = inductor_config.cpp.cxx[0] if isinstance(inductor_config.cpp.cxx, tuple) else None
        candidates = [c for c in (compiler, os.environ.get("CXX"), "g++", "c++", "clang++") if c]
        if not any(shutil.which(c) for c in candidates):
            reason = Unavailable("torch.compile on CPU (inductor) needs a C++ compiler; none of "
                                 f"{', '.join(candidates)} was found on PATH")
    ctx.cache["torch_compile"] = reason
    return reason


def extension_unavailable(ctx: BenchContext, op: str) -> Unavailable | None:
    """The C++ extension this job loaded from its manifest; its outcome decides every cpp_ext row."""
    ext_op = op_spec(op).ext_op
    if ext_op is None:
        return Unavailable(f"the C++ extension has no {op} op")
    if "cpp_ext" not in ctx.cache:
        ctx.cache["cpp_ext"] = _load_extension()
    if ctx.cache["cpp_ext"] is not None:
        return ctx.cache["cpp_ext"]
    import torch

    if not hasattr(torch.ops.gpulab, ext_op):
        return Unavailable(f"the extension loaded but does not define torch.ops.gpulab.{ext_op}", "failed")
    return None


def _load_extension() -> Unavailable | None:
    # The job's script loaded the library its rule's manifest names (gpulab.native.load_from_manifest).
    from gpulab.native import manifest_outcome

    loaded = manifest_outcome()
    if loaded.status != "ok":
        reason = loaded.reason or f"the extension step reported {loaded.status}"
        return Unavailable(f"extension not usable: {reason}", "skipped" if loaded.status == "skipped" else "failed")
    return None


# ---------------------------------------------------------------- torch.compile

_compiled: dict[str, Any] = {}
def compiled_manual(case: Case) -> Callable[..., torch.Tensor]:
    """``torch.compile(manual, dynamic=False)``: one static-shape graph per (shape, dtype).

    The cases of a cell are timed interleaved, so every case's graph must stay live at once (resetting
    dynamo per case, as this once did, sent the earlier cases back to eager PyTorch while they were
    timed: on the H100 half the softmax rows ran at the manual version's speed). Dynamo's recompile
    limit is raised to cover a sweep, and reaching it raises instead of silently running eager. The
    gate and the timed closures of one case share the compiled function, so compilation happens once,
    in the gate's first call.
    """
    key = repr((case.op, case.shape, case.dtype, case.device))
    if key not in _compiled:
        _compiled[key] = static_compile(op_spec(case.op).manual)
    return _compiled[key]


# ---------------------------------------------------------------- the five kinds


@register_kind(Implementation("manual", row_order=1, colour=1, study=("manual_gelu (unfused PyTorch)", 8.1)))
def manual(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """The study's unfused PyTorch: one kernel per operator (the op's ``manual``)."""
    return _bind(op_spec(case.op).manual, inputs)


@register_kind(Implementation("native", row_order=0, colour=0, goal="reference",
                              study=("pytorch_gelu (F.gelu, fused)", 1.1)))
def native(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """PyTorch's fused op (the op's ``native``): the baseline."""
    return _bind(op_spec(case.op).native(), inputs)


@register_kind(Implementation("cpp_ext", row_order=4, colour=2, needs_extension=True, goal="held",
                              study=("CUDA C++ kernel (load_inline)", 1.8)), availability=extension_unavailable)
def cpp_ext(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.ops.gpulab.<ext_op> from the HIP/CUDA C++ extension."""
    import torch

    return _bind(getattr(torch.ops.gpulab, str(op_spec(case.op).ext_op)), inputs)


def triton_ahead(cases: Sequence[Case], info: DeviceInfo) -> None:
    """Compile every kernel the cases' Triton launches need on ``info``'s device (the op module's ``warm_<op>``;
    a module without one compiles at its first launches), all at once on the host's cores, launching nothing."""
    from gpulab.core.dtypes import torch_dtype
    from gpulab.kernels.triton.config import parallel_compile, target_of

    target = target_of(info)
    with parallel_compile():
        for case in cases:
            warm = getattr(op_spec(case.op).triton_kernels(), f"warm_{case.op}", None)
            if warm is not None:
                warm(case.shape, torch_dtype(case.dtype), target)


@register_kind(Implementation("triton", row_order=3, colour=3, runs_triton_kernels=True, goal="held",
                              study=("Triton kernel", 1.8)),
               writes_out=True, availability=triton_unavailable, ahead=triton_ahead)
def triton(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """The wrapper ``<op>(*inputs, out)`` of the op's Triton kernel module."""
    return _bind(triton_launcher(case.op), [*inputs, out])


@register_kind(Implementation("torch_compile", row_order=2, colour=4, needs_inductor=True, goal="reference",
                              study=("torch.compile(manual_gelu)", 1.47)), availability=compile_unavailable)
def torch_compile(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.compile of the op's manual version."""
    return _bind(compiled_manual(case), inputs)


def triton_launcher(op: str) -> Callable[..., torch.Tensor]:
    """The op's Triton wrapper, ``<op>(*inputs, out=None, **launch)``."""
    return getattr(op_spec(op).triton_kernels(), op)


# The implementation kinds, in registration order (the config's ``bench.impls``).
IMPLS = tuple(REGISTRY.kinds())
IMPLEMENTATIONS = {facts.name: facts for facts in REGISTRY.implementations()}


def in_row_order() -> list[str]:
    """The implementations in the aggregated tables' row order."""
    return [f.name for f in sorted(IMPLEMENTATIONS.values(), key=lambda f: f.row_order)]


def in_colour_order() -> list[str]:
    """The implementations by palette slot."""
    return [f.name for f in sorted(IMPLEMENTATIONS.values(), key=lambda f: f.colour)]


def needs_extension(impl: str) -> bool:
    """Whether the implementation's cells load the C++ extension (through the build step's manifest)."""
    facts = REGISTRY.implementation(impl)
    return facts is not None and facts.needs_extension


def runs_triton_kernels(impl: str) -> bool:
    """Whether the implementation's cells run the op's Triton kernel module."""
    facts = REGISTRY.implementation(impl)
    return facts is not None and facts.runs_triton_kernels


def needs_inductor(impl: str) -> bool:
    """Whether the implementation's cells compile with torch.compile's Inductor."""
    facts = REGISTRY.implementation(impl)
    return facts is not None and facts.needs_inductor
