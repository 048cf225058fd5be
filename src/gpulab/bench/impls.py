"""The five implementations of every op, registered once each.

``manual``: the study's unfused PyTorch (one kernel per operator); ``native``: PyTorch's fused op (the
baseline); ``cpp_ext``: the hand-written HIP/CUDA C++ extension (``torch.ops.gpulab``, built by the
extension step); ``triton``: the kernels in ``kernels/triton``; ``torch_compile``: ``torch.compile`` of
``manual``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpulab.bench.ops import OPS, manual_add, manual_gelu, manual_softmax
from gpulab.bench.registry import BenchContext, Case, Unavailable, register

if TYPE_CHECKING:
    import torch

Closure = Callable[[], "torch.Tensor"]
EXTENSION_OPS = {op: spec.ext_op for op, spec in OPS.items()}
MANUAL = {op: spec.manual for op, spec in OPS.items()}


# ---------------------------------------------------------------- availability


def triton_unavailable(ctx: BenchContext) -> Unavailable | None:
    if "triton" in ctx.cache:
        return ctx.cache["triton"]
    reason: Unavailable | None = None
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if importlib.util.find_spec("triton") is None:
        reason = Unavailable("Triton is not installed")
    elif not ctx.info.gpu_available and not interpreted:
        reason = Unavailable(f"Triton needs a GPU driver: {ctx.info.reason}")
    else:
        try:
            for op in ("gelu", "softmax", "add"):
                importlib.import_module(f"gpulab.kernels.triton.{op}")
        except Exception as exc:  # a broken Triton install is a recorded outcome, not a crash
            reason = Unavailable(f"Triton kernels failed to import: {type(exc).__name__}: {exc}", "failed")
    ctx.cache["triton"] = reason
    return reason


def compile_unavailable(ctx: BenchContext) -> Unavailable | None:
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


def extension_unavailable(ctx: BenchContext) -> Unavailable | None:
    """The C++ extension this job loaded from its manifest; its outcome decides every cpp_ext row."""
    if "cpp_ext" in ctx.cache:
        return ctx.cache["cpp_ext"]
    ctx.cache["cpp_ext"] = reason = _load_extension(ctx)
    return reason


def _load_extension(ctx: BenchContext) -> Unavailable | None:
    # The job's script loaded the library its rule's manifest names (gpulab.build.load_from_manifest).
    from gpulab.build import manifest_outcome

    loaded = manifest_outcome()
    if loaded.status != "ok":
        reason = loaded.reason or f"the extension step reported {loaded.status}"
        return Unavailable(f"extension not usable: {reason}", "skipped" if loaded.status == "skipped" else "failed")
    import torch

    missing = [name for name in EXTENSION_OPS.values() if not hasattr(torch.ops.gpulab, name)]
    if missing:
        return Unavailable(f"the extension loaded but does not define torch.ops.gpulab.{', '.join(missing)}",
                           "failed")
    return None


# ---------------------------------------------------------------- torch.compile

_compiled: dict[str, Any] = {}
# Static-shape graphs dynamo may keep for one code object: every case of a cell (sizes x dtypes) at once.
RECOMPILE_LIMIT = 256


def compiled_manual(case: Case) -> Callable[..., torch.Tensor]:
    """``torch.compile(manual, dynamic=False)``: one static-shape graph per (shape, dtype).

    The cases of a cell are timed interleaved, so every case's graph must stay live at once (resetting
    dynamo per case, as this once did, sent the earlier cases back to eager PyTorch while they were
    timed: on the H100 half the softmax rows ran at the manual version's speed). Dynamo's recompile
    limit is raised to cover a sweep, and reaching it raises instead of silently running eager. The
    gate and the timed closures of one case share the compiled function, so compilation happens once,
    in the gate's first call.
    """
    import torch

    key = repr((case.op, case.shape, case.dtype, case.device))
    if key not in _compiled:
        config = torch._dynamo.config
        for name in ("recompile_limit", "accumulated_recompile_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
        if hasattr(config, "fail_on_recompile_limit_hit"):
            config.fail_on_recompile_limit_hit = True
        _compiled[key] = torch.compile(MANUAL[case.op], dynamic=False)
    return _compiled[key]


# ---------------------------------------------------------------- gelu


@register("gelu", "manual")
def gelu_manual(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """Unfused tanh GeLU: one PyTorch kernel per operator (the study's manual_gelu)."""
    (x,) = inputs
    return lambda: manual_gelu(x)


@register("gelu", "native")
def gelu_native(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.nn.functional.gelu(approximate="tanh"): PyTorch's fused kernel."""
    import torch.nn.functional as F

    (x,) = inputs
    return lambda: F.gelu(x, approximate="tanh")


@register("gelu", "cpp_ext", availability=extension_unavailable)
def gelu_cpp_ext(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.ops.gpulab.gelu_tanh from the HIP/CUDA C++ extension."""
    import torch

    op = torch.ops.gpulab.gelu_tanh
    (x,) = inputs
    return lambda: op(x)


@register("gelu", "triton", writes_out=True, availability=triton_unavailable)
def gelu_triton(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """kernels/triton/gelu.py."""
    from gpulab.kernels.triton.gelu import gelu

    (x,) = inputs
    return lambda: gelu(x, out)


@register("gelu", "torch_compile", availability=compile_unavailable)
def gelu_compile(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.compile of the manual GeLU."""
    fn = compiled_manual(case)
    (x,) = inputs
    return lambda: fn(x)


# ---------------------------------------------------------------- softmax


@register("softmax", "manual")
def softmax_manual(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """Five-pass row softmax (max, subtract, exp, sum, divide), as in the study."""
    (x,) = inputs
    return lambda: manual_softmax(x)


@register("softmax", "native")
def softmax_native(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.softmax(x, dim=-1)."""
    import torch

    (x,) = inputs
    return lambda: torch.softmax(x, dim=-1)


@register("softmax", "cpp_ext", availability=extension_unavailable)
def softmax_cpp_ext(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.ops.gpulab.softmax_rows from the HIP/CUDA C++ extension."""
    import torch

    op = torch.ops.gpulab.softmax_rows
    (x,) = inputs
    return lambda: op(x)


@register("softmax", "triton", writes_out=True, availability=triton_unavailable)
def softmax_triton(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """kernels/triton/softmax.py (fused rows; rows wider than a program split over several programs)."""
    from gpulab.kernels.triton.softmax import softmax

    (x,) = inputs
    return lambda: softmax(x, out)


@register("softmax", "torch_compile", availability=compile_unavailable)
def softmax_compile(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.compile of the manual softmax."""
    fn = compiled_manual(case)
    (x,) = inputs
    return lambda: fn(x)


# ---------------------------------------------------------------- add


@register("add", "manual")
def add_manual(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """Unfused add: copy one operand, then accumulate the other in place (two passes)."""
    a, b = inputs
    return lambda: manual_add(a, b)


@register("add", "native")
def add_native(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """a + b."""
    a, b = inputs
    return lambda: a + b


@register("add", "cpp_ext", availability=extension_unavailable)
def add_cpp_ext(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.ops.gpulab.vector_add from the HIP/CUDA C++ extension (the study's custom_add)."""
    import torch

    op = torch.ops.gpulab.vector_add
    a, b = inputs
    return lambda: op(a, b)


@register("add", "triton", writes_out=True, availability=triton_unavailable)
def add_triton(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """kernels/triton/add.py."""
    from gpulab.kernels.triton.add import add

    a, b = inputs
    return lambda: add(a, b, out)


@register("add", "torch_compile", availability=compile_unavailable)
def add_compile(case: Case, inputs: Sequence[torch.Tensor], out: torch.Tensor | None) -> Closure:
    """torch.compile of the manual add (which fuses its two passes into one)."""
    fn = compiled_manual(case)
    a, b = inputs
    return lambda: fn(a, b)
