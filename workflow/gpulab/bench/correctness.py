"""Correctness before timing: every case is checked against a float64 reference first.

Fresh random inputs (never zeros, which hide unwritten outputs and wrong indexing), the output poisoned
with NaN before the call (the ``out=`` buffer of implementations that take one; elsewhere, on a GPU, the
caching allocator's block the output will be carved from), then ``||out - ref|| / ||ref||`` in float64
with a per-dtype tolerance. Any non-finite output fails: the reference of these ops is finite on these
inputs, so a NaN is an element that was never written (or an overflow).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulab.bench.ops import OpSpec
from gpulab.bench.registry import Case, Impl

if TYPE_CHECKING:
    import torch



def _schema_tolerances() -> dict[str, float]:
    from gpulab.config import load_schema

    props = load_schema()["properties"]["bench"]["properties"]["tolerances"]["properties"]
    return {dtype: float(spec["default"]) for dtype, spec in props.items()}


# ||out - ref|| / ||ref||, defaults from the config schema (bench.tolerances). Rounding the exact result
# to the dtype alone gives about 0.6 unit roundoff (fp32 ~4e-8, fp16 ~1.7e-4, bf16 ~1.3e-3 measured); the
# bounds leave room for the unfused implementations' several roundings (manual bf16 GeLU ~1.5e-3 on CPU
# and H100) and fail anything structurally wrong (the erf GeLU instead of the tanh one: ~1e-4 in fp32).
THRESHOLDS = _schema_tolerances()
# float64 chunk of the reference (elements): bounds the gate's extra memory on multi-GiB cases.
REFERENCE_CHUNK_ELEMS = 1 << 26


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    rel_err: float
    max_abs_err: float
    nonfinite: int
    tolerance: float
    cold_call_ms: float  # the case's very first call: compilation, autotuning, JIT all land here
    reason: str = ""

    def as_row(self) -> dict[str, Any]:
        return {"rel_err": self.rel_err, "max_abs_err": self.max_abs_err, "nonfinite": self.nonfinite,
                "tolerance": self.tolerance, "cold_call_ms": self.cold_call_ms}


def tolerance_for(dtype: str, tolerances: Mapping[str, float] | None = None) -> float:
    merged = {**THRESHOLDS, **(tolerances or {})}
    return float(merged[dtype])


def poison_allocator(shape: Sequence[int], dtype: torch.dtype, device: str) -> None:
    """Leave a NaN-filled block of the output's size in the GPU caching allocator, so an implementation
    that allocates its output and skips elements returns NaN there instead of a previous run's values."""
    import torch

    if device == "cpu":
        return
    block = torch.full(tuple(shape), math.nan, dtype=dtype, device=device)
    del block


def relative_error(spec: OpSpec, inputs: Sequence[torch.Tensor], out: torch.Tensor,
                   chunk_elems: int = REFERENCE_CHUNK_ELEMS) -> tuple[float, float, int]:
    """(||out - ref|| / ||ref||, max |out - ref|, non-finite outputs), all in float64, chunked by rows."""
    import torch

    err_sq = ref_sq = 0.0
    max_abs = 0.0
    nonfinite = 0
    for part, ref in spec.reference_chunks(inputs, chunk_elems):
        got = out[part].double()
        bad = ~torch.isfinite(got)
        nonfinite += int(bad.sum().item())
        diff = got - ref
        err_sq += float(torch.sum(diff * diff).item())
        ref_sq += float(torch.sum(ref * ref).item())
        max_abs = max(max_abs, float(diff.abs().max().item()) if diff.numel() else 0.0)
    if nonfinite:
        return math.nan, math.nan, nonfinite
    return math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else math.sqrt(err_sq), max_abs, 0


def synchronize(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def check_case(
    spec: OpSpec,
    impl: Impl,
    case: Case,
    inputs: Sequence[torch.Tensor],
    tolerance: float,
) -> CheckResult:
    """Run ``impl`` once on ``inputs`` (fresh, random) into a poisoned output and compare with float64."""
    import torch

    from gpulab.dtypes import torch_dtype

    dtype = torch_dtype(case.dtype)
    out_shape = tuple(inputs[0].shape)
    out = None
    if impl.writes_out:
        out = torch.full(out_shape, math.nan, dtype=dtype, device=case.device)
    else:
        poison_allocator(out_shape, dtype, case.device)
    fn = impl.factory(case, inputs, out)
    synchronize(case.device)
    start = time.perf_counter()
    result = fn()
    synchronize(case.device)
    cold_ms = (time.perf_counter() - start) * 1e3

    def fail(reason: str, rel: float = math.nan, max_abs: float = math.nan, nonfinite: int = 0) -> CheckResult:
        return CheckResult(False, rel, max_abs, nonfinite, tolerance, cold_ms, reason)

    if not isinstance(result, torch.Tensor):
        return fail(f"returned {type(result).__name__}, not a tensor")
    wrong_device = result.device.type != torch.device(case.device).type
    if tuple(result.shape) != out_shape or result.dtype != dtype or wrong_device:
        return fail(f"returned {tuple(result.shape)} {result.dtype} on {result.device}; expected {out_shape} "
                    f"{dtype} on {case.device}")
    if out is not None and result.data_ptr() != out.data_ptr():
        return fail("registered as writing into out= but returned another tensor (the poisoned buffer went unchecked)")
    rel, max_abs, nonfinite = relative_error(spec, inputs, result)
    if nonfinite:
        return fail(f"{nonfinite} of {result.numel()} outputs are not finite (unwritten or overflowed)",
                    nonfinite=nonfinite)
    if not rel <= tolerance:
        return fail(f"relative error {rel:.3g} exceeds the {case.dtype} tolerance {tolerance:.3g}", rel, max_abs)
    return CheckResult(True, rel, max_abs, 0, tolerance, cold_ms)
