"""The one correctness gate: the closure that is checked is the closure that is timed.

Fresh random inputs are snapshotted, the output poisoned with NaN, compared with the op's float64 reference
(:func:`gpulab.core.ops.check`), and the inputs must be unchanged; :func:`check_output_again` checks the last timed
call the same way. The method is in docs/methodology/correctness.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulab.bench.registry import Case, Impl
from gpulab.core.device import synchronize
from gpulab.core.ops import NORM_TOLERANCES, Check, check, norm_tolerance

if TYPE_CHECKING:
    import torch

THRESHOLDS = NORM_TOLERANCES  # the per-dtype norm bounds, as the report's methodology lists them


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    rel_err: float
    max_abs_err: float
    element_ratio: float
    nonfinite: int
    tolerance: float
    cold_call_ms: float  # the case's first call in this job: compilation, autotuning, JIT (unless cached) land here
    reason: str = ""

    def as_row(self) -> dict[str, Any]:
        return {"rel_err": self.rel_err, "max_abs_err": self.max_abs_err, "element_err_ratio": self.element_ratio,
                "nonfinite": self.nonfinite, "tolerance": self.tolerance, "cold_call_ms": self.cold_call_ms}


def tolerance_for(dtype: str, tolerances: Mapping[str, float] | None = None) -> float:
    return norm_tolerance(dtype, tolerances)


def poison_allocator(shape: Sequence[int], dtype: torch.dtype, device: str) -> None:
    """Leave a NaN-filled block of the output's size in the GPU caching allocator, so an implementation
    that allocates its output and skips elements returns NaN there instead of a previous run's values."""
    import torch

    if device == "cpu":
        return
    block = torch.full(tuple(shape), math.nan, dtype=dtype, device=device)
    del block


@dataclass
class Prepared:
    """One input set with its closure (and its ``out=`` buffer, for implementations that take one)."""

    inputs: list[torch.Tensor]
    closure: Callable[[], torch.Tensor]
    out: torch.Tensor | None


def prepare(impl: Impl, case: Case, inputs: Sequence[torch.Tensor]) -> Prepared:
    """The closure over ``inputs``, with a NaN-poisoned output (buffer or allocator block) before its first call."""
    import torch

    from gpulab.core.dtypes import torch_dtype

    dtype = torch_dtype(case.dtype)
    shape = tuple(inputs[0].shape)
    out = torch.full(shape, math.nan, dtype=dtype, device=case.device) if impl.writes_out else None
    if out is None:
        poison_allocator(shape, dtype, case.device)
    return Prepared(list(inputs), impl.factory(case, inputs, out), out)


# Device memory kept free beyond a device-side snapshot: room for the output and the float64 reference chunks.
SNAPSHOT_HEADROOM_BYTES = 4 * 2**30


def snapshot(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the inputs: on the device when it has room (a GPU copies GiBs in milliseconds), else on
    the host (larger, but a multi-GiB transfer takes seconds)."""
    import torch

    nbytes = sum(t.numel() * t.element_size() for t in inputs)
    on_device = inputs[0].device.type != "cpu" and torch.cuda.mem_get_info()[0] > nbytes + SNAPSHOT_HEADROOM_BYTES
    return [t.detach().clone() if on_device else t.detach().to("cpu", copy=True) for t in inputs]


def inputs_changed(inputs: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> str:
    """Why the inputs differ from their snapshot ('' when they are bit-identical)."""
    import torch

    for i, (now, before) in enumerate(zip(inputs, saved, strict=True)):
        if not torch.equal(now.detach().to(before.device), before):
            return f"the implementation changed its input {i} (inputs must be read-only)"
    return ""


def check_output(case: Case, prepared: Prepared, result: Any, saved: Sequence[torch.Tensor],
                 tolerance: float) -> Check:
    """Type, shape, dtype, device, out= identity, value (ops.check) and untouched inputs of one call's result."""
    return _structural_failure(case, prepared, result, saved, tolerance) or check(
        case.op, result, prepared.inputs, case.dtype, tolerance)


def _structural_failure(case: Case, prepared: Prepared, result: Any, saved: Sequence[torch.Tensor],
                        tolerance: float) -> Check | None:
    """The failed check of a result of the wrong type, shape, dtype or device, of an ignored out= buffer or of
    changed inputs; None when none of these is wrong."""
    import torch

    from gpulab.core.dtypes import torch_dtype

    def fail(reason: str) -> Check:
        return Check(False, math.nan, math.nan, math.nan, 0, tolerance, reason)

    dtype, shape = torch_dtype(case.dtype), tuple(prepared.inputs[0].shape)
    if not isinstance(result, torch.Tensor):
        return fail(f"returned {type(result).__name__}, not a tensor")
    if tuple(result.shape) != shape or result.dtype != dtype or result.device.type != torch.device(case.device).type:
        return fail(f"returned {tuple(result.shape)} {result.dtype} on {result.device}; expected {shape} {dtype} on "
                    f"{case.device}")
    if prepared.out is not None and result.data_ptr() != prepared.out.data_ptr():
        return fail("registered as writing into out= but returned another tensor (the poisoned buffer went unchecked)")
    changed = inputs_changed(prepared.inputs, saved)
    return fail(changed) if changed else None


def check_output_again(case: Case, prepared: Prepared, result: Any, saved: Sequence[torch.Tensor],
                       tolerance: float, kept: torch.Tensor | None, gate: CheckResult) -> Check:
    """:func:`check_output` of a later call of the closure the gate checked, on the same inputs (``saved`` is
    their snapshot from before the gate's call). Where the gate's output was kept (``kept``) and this result
    has the same bits (NaN never compares equal), the gate's comparison with the float64 reference holds for
    it unchanged, so it is reused rather than computed again (on a CPU the reference and the comparison cost
    more than the whole gate call); type, shape, out= identity and untouched inputs are still checked."""
    import torch

    if kept is None or not isinstance(result, torch.Tensor):  # kept only from a gate that passed
        return check_output(case, prepared, result, saved, tolerance)
    wrong = _structural_failure(case, prepared, result, saved, tolerance)
    if wrong is not None:
        return wrong
    if result.dtype == kept.dtype and result.shape == kept.shape and torch.equal(result, kept):
        return Check(True, gate.rel_err, gate.max_abs_err, gate.element_ratio, 0, tolerance)
    return check(case.op, result, prepared.inputs, case.dtype, tolerance)


def check_case(case: Case, prepared: Prepared, tolerance: float,
               keep: bool = False) -> tuple[CheckResult, list[torch.Tensor], torch.Tensor | None]:
    """Run the prepared closure once (its cold call) and check it; returns the result, the input snapshot and,
    with ``keep``, a copy of the checked output when it passed (for :func:`check_output_again`)."""
    saved = snapshot(prepared.inputs)
    synchronize(case.device)
    start = time.perf_counter()
    result = prepared.closure()
    synchronize(case.device)
    cold_ms = (time.perf_counter() - start) * 1e3
    got = check_output(case, prepared, result, saved, tolerance)
    # A copy: an out= buffer is written again by every timed call.
    kept = result.detach().clone() if keep and got.passed else None
    return CheckResult(got.passed, got.rel_err, got.max_abs_err, got.element_ratio, got.nonfinite, tolerance,
                       cold_ms, got.reason), saved, kept
