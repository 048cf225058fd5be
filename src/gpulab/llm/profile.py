"""Where the time of a prefill, of a decode token and of a study token goes: each run once more under
``torch.profiler``, its kernels' device time summed per step and put beside the step's unprofiled time.

The gap between kernels and step (launches, host work, idle device) is then a figure too; programmatic-dependent
launches count their wait, so their sum can exceed the step. On a CPU the unit is an op's own CPU time. No torch
import at module level: the report reads the table with these helpers.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import pandas as pd

from gpulab.core.device import DeviceInfo, synchronize, teardown_profiler_after_use
from gpulab.core.kernel_trace import classify_kernel, cpu_op_records, device_kernel_records, short_kernel_name
from gpulab.core.tables import Column, TableSchema
from gpulab.llm.engines import ENGINES

log = logging.getLogger(__name__)

PROFILED_TOKENS = 16
# Attention kernels of either vendor: cuDNN's and PyTorch's flash/memory-efficient SDPA, AOTriton, CK's FMHA.
_ATTENTION_WORDS = ("sdpa", "fmha", "flash", "attention", "attn")
CATEGORIES = ("matmul", "attention", "activation", "reduction", "other")

LLM_KERNELS = TableSchema(
    "llm_kernels",
    (
        Column("model", "str", "the spec as configured"),
        Column("engine", "str", " | ".join(ENGINES)),
        Column("test", "str", "pp<N> (a step is one prefill of the N-token prompt) | tg<N> (a step is one token) | "
               "study (a step is one token of the study's call: its sampling, its prompt's prefill spread over "
               "the profiled tokens)"),
        Column("device", "str", "the device the run was profiled on"),
        Column("kernel", "str", "kernel name, shortened (ATen op or Inductor C++ kernel on a CPU)"),
        Column("category", "str", "matmul | attention | activation (elementwise, Inductor's pointwise kernels) | "
               "reduction (norms, softmax, the token choice) | other (copies, fills, unrecognised)"),
        Column("calls_per_step", "float", "launches of this kernel per step"),
        Column("us_per_step", "float", "its device time per step, microseconds"),
        Column("share_of_step", "float", "us_per_step over step_us: the share of a step's measured time"),
        Column("step_us", "float", "mean time of a step in the test's own row (not profiled), microseconds"),
        Column("steps", "int", "steps run under the profiler"),
    ),
    path="llm/kernels/{model}__{engine}.csv",
)


def category(name: str) -> str:
    """:func:`gpulab.core.kernel_trace.classify_kernel`'s categories, with attention kernels apart."""
    lower = name.lower()
    if any(word in lower for word in _ATTENTION_WORDS):
        return "attention"
    return classify_kernel(name)


def profile_run(run: Callable[[], Any], info: DeviceInfo) -> list[Any]:
    """Kernel records (:class:`gpulab.core.kernel_trace.KernelRecord`) of one call of ``run``. On a GPU the device
    activity alone: the rows need no launching op, and recording every CPU op of transformers' 16 study tokens
    and building their events took most of the 7B ``hf`` job's 28 s of profiles on the H100."""
    from torch.profiler import ProfilerActivity, profile

    teardown_profiler_after_use()
    synchronize(info)
    with profile(activities=[ProfilerActivity.CUDA if info.gpu_available else ProfilerActivity.CPU]) as prof:
        run()
        synchronize(info)
    events = prof.events()
    return device_kernel_records(events, ("graph", "graph replay")) if info.gpu_available else cpu_op_records(events)


def kernel_rows(records: list[Any], steps: int, step_us: float) -> list[dict[str, Any]]:
    """One row per kernel name: calls and device time per step, largest first."""
    frame = pd.DataFrame([{"kernel": short_kernel_name(r.kernel), "category": category(r.kernel),
                           "time_us": r.time_us} for r in records], columns=["kernel", "category", "time_us"])
    if frame.empty:
        return []
    grouped = frame.groupby(["kernel", "category"], as_index=False).agg(calls=("time_us", "size"),
                                                                       time_us=("time_us", "sum"))
    grouped = grouped.sort_values("time_us", ascending=False, ignore_index=True)
    return [{"kernel": g.kernel, "category": g.category, "calls_per_step": g.calls / steps,
             "us_per_step": g.time_us / steps, "share_of_step": g.time_us / steps / step_us,
             "step_us": step_us, "steps": steps, "status": "ok", "reason": ""} for g in grouped.itertuples()]


def step_kernels(test: str, run: Callable[[], Any], steps: int | Callable[[], int], step_us: float,
                 info: DeviceInfo) -> list[dict[str, Any]]:
    """The kernel rows of ``run`` (``steps`` steps of ``test``, or a function giving how many it ran), or one
    row saying why there are none."""
    count = None if callable(steps) else steps
    try:
        records = profile_run(run, info)
        count = steps() if callable(steps) else steps
        rows = kernel_rows(records, count, step_us) if count else []
    except Exception as exc:  # the profile is a finding about the run, not a reason to lose the run's figures
        log.error("profiling %s failed:\n%s", test, traceback.format_exc())
        rows = [{"status": "failed", "reason": f"profiling {test}: {type(exc).__name__}: {exc}"[:400]}]
    if not rows:
        rows = [{"status": "skipped", "reason": "the profiler recorded no kernels"}]
    return [{"test": test, "steps": count, **row} for row in rows]


def category_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per engine and test: µs per step in each category, the step's measured time and what no kernel covers."""
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame()
    keys = ["target", "model", "engine", "test"]
    sums = ok.pivot_table(index=keys, columns="category", values="us_per_step", aggfunc="sum", fill_value=0.0)
    sums = sums.reindex(columns=[c for c in CATEGORIES if c in sums.columns])
    out = sums.assign(kernels=sums.sum(axis=1), step=ok.groupby(keys)["step_us"].first())
    out["not in a kernel"] = (out["step"] - out["kernels"]).clip(lower=0)
    return out.reset_index()
