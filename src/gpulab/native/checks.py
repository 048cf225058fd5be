"""The extension step's checks table: every op of the registry with an extension op against its float64
reference, and every operator given bad input, the bad calls in a process of their own (a crash is a ``failed`` row).

Correctness: the entry's inputs at odd sizes, unaligned views, all three dtypes, outputs poisoned with NaN. Bad input:
a RuntimeError naming the problem and the offending tensor, or an empty result for empty tensors.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.core.device import DeviceInfo, detect, probe
from gpulab.core.device_lock import child_should_claim
from gpulab.core.ops import OPS, OpSpec, kernel_tolerance
from gpulab.core.tables import Column, TableSchema
from gpulab.core.tools import run_tool

EXTENSION_CHECKS = TableSchema(
    "extension_checks",
    (
        Column("op", "str", "the extension op (torch.ops.gpulab.<op>): an op registry entry's ext_op"),
        Column("dtype", "str", "fp32 | fp16 | bf16 (bad input: the dtype of the input, e.g. int64)"),
        Column("shape", "str", "input shape"),
        Column("layout", "str", "aligned | offset (a view 1 element into its storage: not 16-byte aligned); "
                                "bad input: the case's layout"),
        Column("device", "str", "where the operator ran (cuda is HIP on ROCm)"),
        Column("max_abs_err", "float", "largest |out - ref|, ref computed in float64 from the same inputs"),
        Column("rel_err", "float", "||out - ref|| / ||ref||"),
        Column("max_abs_diff_native", "float", "largest |out - PyTorch's own op| on the same inputs"),
        Column("unwritten", "int", "output elements still holding the poison (NaN) or otherwise non-finite"),
        Column("rtol", "float", "elementwise tolerance: |out - ref| <= atol + rtol |ref|"),
        Column("atol", "float", "elementwise tolerance"),
        Column("kind", "str", "correctness (against the reference) | bad_input (a call that must be refused)"),
        Column("case", "str", "bad input: the case's name"),
        Column("expected", "str", "bad input: what the call must do (raise naming ..., or return empty)"),
        Column("message", "str", "bad input: the error the call raised, or what it did instead"),
    ),
    path="build/extension_checks.csv",
)

# ------------------------------------------------------------------------------------- correctness


def checked_ops() -> list[OpSpec]:
    """The registered ops the extension has (an ``ext_op``): the ones this step checks."""
    return [spec for spec in OPS.values() if spec.ext_op]


def check_shapes(spec: OpSpec, on_gpu: bool) -> list[tuple[int, ...]]:
    """Sizes of the op's rank that are not multiples of any block or vector width, tails included, plus a few
    round ones."""
    if spec.ndim == 1:
        shapes = [(1,), (3,), (7,), (8,), (1023,), (1025,), (4097,), (98433,), (1 << 20,), ((1 << 20) + 5,)]
        return [*shapes, (3 * (1 << 22) + 7,)] if on_gpu else shapes
    shapes = [(1, 1), (3, 7), (5, 33), (7, 256), (4, 1000), (16, 1024), (3, 1500), (2, 4097), (4, 16384),
              (2, 20000), (2, 40000), (1, 100003)]
    more = [(129, 8), (1000, 256), (257, 1024), (33, 16384), (2, 24576), (3, 65536), (2, 131072)]
    return shapes + more if on_gpu else shapes


def _inputs(spec: OpSpec, shape: tuple[int, ...], dtype: Any, layout: str, dev: str, gen: Any) -> list[Any]:
    """Fresh inputs drawn as the op's entry says (randn * input_scale), ``offset`` ones a view 1 element in."""
    import torch

    numel = math.prod(shape)
    start = 1 if layout == "offset" else 0
    storage = [(torch.randn(numel + 1, generator=gen) * spec.input_scale).to(dtype).to(dev)
               for _ in range(spec.n_inputs)]
    return [s[start:start + numel].view(shape) for s in storage]


def _compare(spec: OpSpec, out: Any, inputs: Sequence[Any], rtol: float, atol: float) -> dict[str, Any]:
    import torch

    ref = spec.reference(*inputs)
    out64 = out.double()
    err = (out64 - ref).abs()
    unwritten = int((~torch.isfinite(out64)).sum())
    within = bool((err <= atol + rtol * ref.abs()).all()) and unwritten == 0 and out.shape == ref.shape
    norm = float(ref.norm())
    reason = "" if within else f"|out - ref| exceeds {atol:g} + {rtol:g}|ref|" + (
        f"; {unwritten} non-finite outputs" if unwritten else "")
    native = spec.native()(*inputs)
    return {"status": "ok" if within and out.dtype == inputs[0].dtype else "incorrect", "reason": reason,
            "max_abs_err": float(err.max()) if out.numel() else 0.0,
            "rel_err": float((out64 - ref).norm()) / norm if norm else 0.0,
            "max_abs_diff_native": float((out64 - native.double()).abs().max()) if out.numel() else 0.0,
            "unwritten": unwritten}


def check_ops(target: str, fingerprint: str, device: DeviceInfo | None = None,
              dtypes: Sequence[str] = ("fp32", "fp16", "bf16"), seed: int = 0,
              ops: Sequence[OpSpec] | None = None) -> list[dict[str, Any]]:
    """Each extension op (default: :func:`checked_ops`) against its float64 reference on fresh random inputs,
    outputs poisoned beforehand; every op draws its inputs from ``seed``."""
    import torch

    from gpulab.core.dtypes import torch_dtype

    info = device or detect()
    dev = info.torch_device
    rows = []
    for spec in checked_ops() if ops is None else ops:
        fn = getattr(torch.ops.gpulab, str(spec.ext_op))
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for dtype in dtypes:
            rtol, atol = kernel_tolerance(spec, dtype)
            for shape in check_shapes(spec, info.gpu_available):
                for layout in ("aligned", "offset"):
                    inputs = _inputs(spec, shape, torch_dtype(dtype), layout, dev, gen)
                    # The caching allocator hands the freed NaN block to the operator's output.
                    del_poison = torch.full(shape, float("nan"), dtype=torch_dtype(dtype), device=dev)
                    del del_poison
                    out = fn(*inputs)
                    if info.gpu_available:
                        torch.cuda.synchronize()
                    rows.append({"target": target, "fingerprint": fingerprint,
                                 **_compare(spec, out, inputs, rtol, atol), "op": spec.ext_op, "dtype": dtype,
                                 "shape": "x".join(map(str, shape)), "layout": layout, "device": dev,
                                 "rtol": rtol, "atol": atol, "kind": "correctness"})
    return rows


# -------------------------------------------------------------------------------------- bad input


@dataclass(frozen=True)
class BadCase:
    """One call the operators must refuse (``expect``: substrings of the message) or answer empty."""

    name: str
    op: str
    layout: str
    dtype: str
    make: Callable[[str], tuple[Any, ...]]  # device -> the call's arguments
    expect: tuple[str, ...] = ()  # () means: an empty result of the input's shape
    needs_gpu: bool = False

    @property
    def expected(self) -> str:
        if not self.expect:
            return "an empty result of the input's shape"
        return "RuntimeError naming " + " and ".join(repr(e) for e in self.expect)


def _t(*shape: int, dtype: str = "float32", dev: str = "cpu") -> Any:
    import torch

    if dtype == "int64":
        return torch.arange(math.prod(shape), device=dev).reshape(shape)
    return torch.randn(*shape, device=dev).to(getattr(torch, dtype))


# Every refusal must also name the op and the offending tensor (shape, strides, dtype, device): see
# MESSAGE_MUST_NAME, asserted for every raising case.
MESSAGE_MUST_NAME = ("gpulab::", "shape [", "strides [", "dtype ", "device ")
BAD_CASES = (
    BadCase("vector_add_transposed", "vector_add", "transposed", "fp32",
            lambda d: (_t(48, 64, dev=d), _t(64, 48, dev=d).t()), ("must be contiguous", "strides [1, 48]")),
    BadCase("vector_add_mismatched_shapes", "vector_add", "contiguous", "fp32",
            lambda d: (_t(10, dev=d), _t(12, dev=d)), ("shape [10] but b has shape [12]", "no broadcasting")),
    BadCase("vector_add_broadcast_view", "vector_add", "expanded (stride 0)", "fp32",
            lambda d: (_t(4, 8, dev=d), _t(8, dev=d).expand(4, 8)), ("must be contiguous", "strides [0, 1]")),
    BadCase("vector_add_dtype_mismatch", "vector_add", "contiguous", "fp32+fp16",
            lambda d: (_t(10, dev=d), _t(10, dtype="float16", dev=d)), ("dtype Float but b has dtype Half",)),
    BadCase("vector_add_device_mix", "vector_add", "contiguous", "fp32",
            lambda d: (_t(10, dev=d), _t(10)), ("but b is on cpu", "one device"), needs_gpu=True),
    BadCase("vector_add_int64", "vector_add", "contiguous", "int64",
            lambda d: (_t(10, dtype="int64", dev=d), _t(10, dtype="int64", dev=d)), ("dtype Long", "expected float32")),
    BadCase("gelu_tanh_transposed", "gelu_tanh", "transposed", "fp32",
            lambda d: (_t(64, 48, dev=d).t(),), ("must be contiguous", "strides [1, 48]")),
    BadCase("gelu_tanh_int64", "gelu_tanh", "contiguous", "int64",
            lambda d: (_t(10, dtype="int64", dev=d),), ("dtype Long", "expected float32")),
    BadCase("gelu_tanh_float64", "gelu_tanh", "contiguous", "fp64",
            lambda d: (_t(10, dtype="float64", dev=d),), ("dtype Double", "expected float32")),
    BadCase("softmax_rows_3d", "softmax_rows", "contiguous", "fp32",
            lambda d: (_t(2, 3, 4, dev=d),), ("must be 2-D", "[2, 3, 4]")),
    BadCase("softmax_rows_1d", "softmax_rows", "contiguous", "fp32",
            lambda d: (_t(7, dev=d),), ("must be 2-D", "1-D shape [7]")),
    BadCase("softmax_rows_column_strided", "softmax_rows", "column-strided view", "fp32",
            lambda d: (_t(64, 48, dev=d)[:, ::2],), ("must be contiguous", "strides [48, 2]")),
    BadCase("softmax_rows_transposed", "softmax_rows", "transposed", "fp32",
            lambda d: (_t(64, 48, dev=d).t(),), ("must be contiguous", "strides [1, 48]")),
    BadCase("softmax_rows_int64", "softmax_rows", "contiguous", "int64",
            lambda d: (_t(4, 4, dtype="int64", dev=d),), ("dtype Long", "expected float32")),
    BadCase("vector_add_empty", "vector_add", "empty", "fp32", lambda d: (_t(0, dev=d), _t(0, dev=d))),
    BadCase("gelu_tanh_empty", "gelu_tanh", "empty", "fp32", lambda d: (_t(0, 3, dev=d),)),
    BadCase("softmax_rows_no_rows", "softmax_rows", "empty", "fp32", lambda d: (_t(0, 8, dev=d),)),
    BadCase("softmax_rows_no_cols", "softmax_rows", "empty", "fp32", lambda d: (_t(4, 0, dev=d),)),
)
CASES = {c.name: c for c in BAD_CASES}


def call_case(name: str, device: str) -> dict[str, Any]:
    """Run one case in this process (the extension loaded): what it raised or returned."""
    import torch

    case = CASES[name]
    args = case.make(device)
    shape = " and ".join("x".join(map(str, a.shape)) or "scalar" for a in args)
    try:
        out = getattr(torch.ops.gpulab, case.op)(*args)
        if device != "cpu":
            torch.cuda.synchronize()
    except Exception as exc:  # the point of the case: what the operator raises, whatever it is
        return {"raised": type(exc).__name__, "message": str(exc).split("\nException raised from")[0].strip(),
                "shape": shape}
    return {"raised": "", "shape": shape,
            "message": f"returned shape {list(out.shape)} dtype {out.dtype} on {out.device}",
            "shape_ok": tuple(out.shape) == tuple(args[0].shape) and out.numel() == 0}


def judge(case: BadCase, got: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) of a case from what its process reported."""
    if not case.expect:
        if got["raised"]:
            return "failed", f"raised {got['raised']} on a valid empty input"
        if not got.get("shape_ok"):
            return "failed", "the result is not an empty tensor of the input's shape"
        return "ok", ""
    if got["raised"] != "RuntimeError":
        return "failed", f"expected a RuntimeError, got {got['raised'] or 'a result'}"
    missing = [s for s in (*case.expect, *MESSAGE_MUST_NAME) if s not in got["message"]]
    return ("ok", "") if not missing else ("failed", f"the message does not name {', '.join(map(repr, missing))}")


def _cases_in_subprocess(manifest: Path, names: Sequence[str], device: str,
                         timeout_s: float, claim: bool = False) -> dict[str, dict[str, Any]]:
    """What each case did, the cases run in order in one fresh process that prints one JSON line per case
    (one torch import, not one per case). A crash or time-out is charged to the first case without a line;
    the cases after it go on in a new process, so one bad case never hides the others' outcomes."""
    results: dict[str, dict[str, Any]] = {}
    todo = list(names)
    while todo:
        argv = [sys.executable, "-m", "gpulab.native", "case", "--manifest", str(manifest), "--device", device,
                *(arg for name in todo for arg in ("--case", name)), *(["--claim-device"] if claim else [])]
        result = run_tool("python:gpulab.native case", argv, timeout_s=timeout_s * len(todo))
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                got = json.loads(line)
                results[got.pop("case")] = got
        todo = [n for n in todo if n not in results]
        if todo:  # the process ended before its next case reported: that case brought it down
            results[todo.pop(0)] = {"crashed": _crash_reason(result)}
    return results


def _crash_reason(result: Any) -> str:
    code = result.exit_status
    how = (f"the process was killed by signal {-code} ({_signal_name(-code)})" if code is not None and code < 0
           else result.reason or "the process exited before reporting this case")
    tail = (result.stderr.strip().splitlines() or [""])[-1][:300]
    return f"{how}{': ' + tail if tail else ''}"


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _bad_input_row(case: BadCase, got: dict[str, Any] | None, info: DeviceInfo) -> dict[str, Any]:
    dev = info.torch_device
    base = {"kind": "bad_input", "case": case.name, "op": case.op, "dtype": case.dtype, "layout": case.layout,
            "device": dev, "expected": case.expected}
    if got is None:  # not run: it needs a GPU
        why = info.reason or "no GPU"
        return {**base, "status": "skipped", "reason": f"needs a GPU and a CPU tensor to mix: {why}"}
    if "crashed" in got:
        return {**base, "status": "failed", "reason": got["crashed"], "message": got["crashed"]}
    status, reason = judge(case, got)
    return {**base, "status": status, "reason": reason, "message": got["message"], "shape": got["shape"]}


def check_bad_inputs(target: str, fingerprint: str, manifest: Path, device: DeviceInfo | None = None,
                     cases: Sequence[BadCase] = BAD_CASES, timeout_s: float = 300) -> list[dict[str, Any]]:
    """Rows of the bad-input cases, run in a fresh process that loads the manifest's library (a crash
    there is a ``failed`` row, see :func:`_cases_in_subprocess`); ``timeout_s`` per case. Without ``device`` the
    fresh process claims the device itself (gpulab.core.device): call this before this process claims it."""
    info = device or probe()
    runnable = [c.name for c in cases if info.gpu_available or not c.needs_gpu]
    claim = device is None and child_should_claim()
    got = _cases_in_subprocess(manifest, runnable, info.torch_device, timeout_s, claim) if runnable else {}
    return [{"target": target, "fingerprint": fingerprint, **_bad_input_row(c, got.get(c.name), info)}
            for c in cases]
