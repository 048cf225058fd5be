"""Profiler events -> kernel rows: which kernels ran, how long, in which phase, of which kind.

Kernels are classified by name for both vendors (BLAS and CK GEMMs and Inductor templates: matmul; ATen math:
activation; reduce kernels: reduction; the rest: other); the phase comes from the op that launched the kernel
(backward, forward, graph). No torch import at module level: the report uses the naming helpers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

PHASES = ("forward", "backward", "graph", "other")
CATEGORIES = ("matmul", "activation", "reduction", "other")

# record_function ranges the profiled step opens; the backward range only matters on CPU, where the
# autograd engine runs in the calling thread.
FORWARD_RANGE = "gpulab.mlp.forward"
BACKWARD_RANGE = "gpulab.mlp.backward"
# A graph variant replays forward and backward as one graph: its kernels have no finer phase than this.
GRAPH_RANGE = "gpulab.mlp.graph_replay"
GRAPH_LAUNCH = "graph replay"  # launched_by of a replay's kernels
# Below this share of the timed step spent in kernels the device mostly waits for the host to launch work.
HOST_BOUND_SHARE = 0.8
AUTOGRAD_NODE_PREFIX = "autograd::engine::evaluate_function"
BACKWARD_FUNCTION_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION

# Copies and fills issued by the runtime, on either vendor (ROCm may report them as kernels).
_MEMORY = ("memcpy", "memset", "__amd_rocclr_copybuffer", "__amd_rocclr_fillbuffer")
_TRITON_PREFIXES = (
    ("triton_tem_", "matmul"),
    ("triton_red_", "reduction"),
    ("triton_per_", "reduction"),
    ("triton_poi_", "activation"),
)
_MATMUL_WORDS = ("gemm", "gemv", "xmma", "cutlass", "cublas", "nvjet", "cijk_", "splitkreduce", "hipblaslt",
                 "rocblas", "wvsplitk", "mfma", "wmma")
_REDUCTION_WORDS = ("reduce", "mean", "sum")
_MOVEMENT_WORDS = ("copy", "fill")
_ACTIVATION_WORDS = ("gelu", "tanh", "erf", "elementwise", "elemwise", "pointwise")
_ATEN_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot",
                "_addmm_activation", "mkldnn_linear", "_mkl_linear"}
_ATEN_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "norm", "var", "std", "prod"}
_ATEN_ELEMENTWISE = {"gelu", "gelu_backward", "tanh", "erf", "add", "add_", "mul", "mul_", "div", "div_", "sub",
                     "threshold_backward", "where"}


def classify_kernel(name: str) -> str:
    """``matmul`` | ``activation`` (GeLU and other elementwise math) | ``reduction`` | ``other`` (copies,
    casts, fills, anything unrecognised).

    Works on device kernel names of either vendor, Inductor's Triton and C++ kernel names, and ATen op
    names (the unit of a CPU-only profile).
    """
    lower = name.strip().lower()
    if lower.startswith("aten::"):
        op = lower.removeprefix("aten::")
        if op in _ATEN_MATMUL:
            return "matmul"
        if op in _ATEN_REDUCTION:
            return "reduction"
        if op in _ATEN_ELEMENTWISE:
            return "activation"
        return "other"
    if any(word in lower for word in _MEMORY):
        return "other"
    for prefix, category in _TRITON_PREFIXES:
        if lower.startswith(prefix):
            return category
    if "cpp_fused" in lower:  # Inductor's C++ kernels (graph_<n>_cpp_fused_<ops>_<n>) name their ops
        return "reduction" if any(w in lower for w in _REDUCTION_WORDS) else "activation"
    # Matmul libraries first: cuBLAS's split-K epilogue is named ...splitKreduce_kernel.
    if any(word in lower for word in _MATMUL_WORDS):
        return "matmul"
    if any(word in lower for word in _REDUCTION_WORDS):
        return "reduction"
    if any(word in lower for word in _MOVEMENT_WORDS):  # e.g. autocast's bfloat16_copy_kernel_cuda
        return "other"
    if any(word in lower for word in _ACTIVATION_WORDS):
        return "activation"
    return "other"


_FUNCTOR = re.compile(r"(\w+(?:Functor|KernelImpl|Ops|_functor|_kernel_cuda|_kernel)\w*)")


def short_kernel_name(name: str, width: int = 70) -> str:
    """A readable label for a (possibly very long, templated) kernel name, for plots and tables.

    ``void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)...>(int, ...)``
    becomes ``vectorized_elementwise_kernel<GeluCUDAKernelImpl>``.
    """
    # "(anonymous namespace)::" is a scope, not a parameter list (ATen's cat kernel lives in one)
    text = name.strip().removeprefix("void ").replace("(anonymous namespace)::", "")
    if text.startswith("aten::"):
        return text if len(text) <= width else text[: width - 1] + "…"
    depth = 0
    for i, ch in enumerate(text):  # drop the parameter list: the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            text = text[:i]
            break
    base, bracket, args = text.partition("<")
    base = base.strip().split("::")[-1]
    if bracket:
        functor = _FUNCTOR.search(args)
        if functor:
            base = f"{base}<{functor.group(1)}>"
        else:
            first = next((a.strip() for a in args.split(",") if a.strip() and not a.strip()[0].isdigit()), "")
            label = re.sub(r"[<>].*", "", first).split("::")[-1]
            base = f"{base}<{label or '…'}>"
    return base if len(base) <= width else base[: width - 1] + "…"


def phase_of(event: Any) -> str:
    """forward | backward | graph | other, from the ranges enclosing a CPU op (``FunctionEvent``)."""
    node = event
    while node is not None:
        name = node.name
        if (getattr(node, "scope", None) == BACKWARD_FUNCTION_SCOPE or name.startswith(AUTOGRAD_NODE_PREFIX)
                or name == BACKWARD_RANGE):
            return "backward"
        if name == FORWARD_RANGE:
            return "forward"
        if name == GRAPH_RANGE:
            return "graph"
        node = node.cpu_parent
    return "other"


@dataclass(frozen=True)
class KernelRecord:
    """One execution of one kernel (or, on CPU-only runs, one ATen op's own time)."""

    kernel: str
    launched_by: str
    phase: str
    time_us: float


def _is_cpu(event: Any) -> bool:
    return str(event.device_type).rsplit(".", 1)[-1] == "CPU"


def _duration_us(event: Any) -> float:
    return event.time_range.end - event.time_range.start


def device_kernel_records(events: Iterable[Any], unlinked: tuple[str, str] = ("other", "")) -> list[KernelRecord]:
    """Every device activity (kernel, copy, fill) of a CPU+device profile, with the op that launched it.

    The profiler files each device activity under the CPU op that launched it (``FunctionEvent.kernels``).
    A ``record_function`` range is mirrored on the device timeline as a "GPU user annotation" and filed
    the same way; it is not a kernel, so only activities that also appear as device events that are not
    annotations are kept. Device activities no profiled op launched are kept with the ``(phase,
    launched_by)`` given as ``unlinked``: a graph replay's kernels are such (seen on an H100, PyTorch 2.11
    with CUDA 13: none is filed under the replay's range), so a graph variant passes its own labels.
    """
    events = list(events)
    remaining: Counter[tuple[str, float]] = Counter(
        (e.name, _duration_us(e)) for e in events
        if not _is_cpu(e) and not getattr(e, "is_user_annotation", False)
    )
    records: list[KernelRecord] = []
    for op in events:
        if not _is_cpu(op) or op.is_async or not op.kernels:
            continue
        phase = None
        for kernel in op.kernels:
            key = (kernel.name, kernel.duration)
            if remaining[key] <= 0:
                continue
            remaining[key] -= 1
            phase = phase or phase_of(op)
            records.append(KernelRecord(kernel.name, op.name, phase, float(kernel.duration)))
    for (name, duration), count in remaining.items():
        records.extend(KernelRecord(name, unlinked[1], unlinked[0], float(duration)) for _ in range(count))
    return records


_PYTHON_FRAME = re.compile(r"^(<built-in |<frozen |nn\.Module: )|\.py\(\d+\): ")


def is_python_frame(name: str) -> bool:
    """Python-tracer events (with_stack): call frames, not ops; their names carry addresses and line numbers."""
    return bool(_PYTHON_FRAME.search(name))


def _calling_op(op: Any) -> str:
    """Nearest enclosing op or range, skipping Python frames."""
    node = op.cpu_parent
    while node is not None and is_python_frame(node.name):
        node = node.cpu_parent
    return node.name if node is not None else ""


def is_compute_op(name: str) -> bool:
    """CPU-only profiles: the ops whose own time is the work (ATen ops and Inductor's C++ kernels)."""
    return name.startswith("aten::") or "cpp_fused" in name


def cpu_op_records(events: Iterable[Any]) -> list[KernelRecord]:
    """The CPU-only counterpart of :func:`device_kernel_records`: each compute op's self CPU time."""
    records = []
    for op in events:
        if not _is_cpu(op) or op.is_async or not is_compute_op(op.name):
            continue
        self_us = float(op.self_cpu_time_total)
        if self_us <= 0:
            continue
        records.append(KernelRecord(op.name, _calling_op(op), phase_of(op), self_us))
    return records


def kernel_table(records: Iterable[KernelRecord], steps: int) -> pd.DataFrame:
    """Records summed per (phase, category, kernel, launching op), largest first, with shares of the total."""
    frame = pd.DataFrame([r.__dict__ for r in records], columns=["kernel", "launched_by", "phase", "time_us"])
    columns = ["phase", "category", "kernel", "launched_by", "calls", "time_us", "time_per_step_us", "share"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["category"] = frame["kernel"].map(classify_kernel)
    grouped = (frame.groupby(["phase", "category", "kernel", "launched_by"], as_index=False)
               .agg(calls=("time_us", "size"), time_us=("time_us", "sum")))
    grouped["time_per_step_us"] = grouped["time_us"] / steps
    total = grouped["time_us"].sum()
    grouped["share"] = grouped["time_us"] / total if total > 0 else float("nan")
    return grouped.sort_values("time_us", ascending=False, ignore_index=True)[columns]


def op_table(averages: Iterable[Any]) -> pd.DataFrame:
    """``key_averages()`` as data: one row per op, range or device activity (Python frames left out)."""
    rows = []
    for avg in averages:
        if is_python_frame(avg.key):
            continue
        device_total = getattr(avg, "device_time_total", None)
        self_device = getattr(avg, "self_device_time_total", None)
        rows.append({
            "op": avg.key,
            "device_type": str(avg.device_type).rsplit(".", 1)[-1],
            "calls": int(avg.count),
            "cpu_total_us": float(avg.cpu_time_total),
            "self_cpu_us": float(avg.self_cpu_time_total),
            "device_total_us": float(device_total if device_total is not None else avg.cuda_time_total),
            "self_device_us": float(self_device if self_device is not None else avg.self_cuda_time_total),
            "user_annotation": bool(getattr(avg, "is_user_annotation", False)),
        })
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["self_device_us", "self_cpu_us"], ascending=False, ignore_index=True)
