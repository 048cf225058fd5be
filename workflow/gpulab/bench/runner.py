"""Run one cell of the matrix (an op x implementation over all sizes and dtypes): check, then time.

Each case is checked by the correctness gate on fresh inputs; only a passing case is timed, with the
project's one timing function, and what is timed is the very closure that was checked (and, when the
cache is not flushed, closures over further input sets built the same way). The output of the last
timed call is checked again and the inputs must still be unchanged. Every case becomes exactly one row
whatever happens: ``ok``, ``incorrect`` (with its error figures), ``oom`` (the rest goes on),
``skipped`` (implementation unavailable here, with the reason) or ``failed`` (it raised). Each ok row says
whether its timing was stable and records the GPU's clocks, temperature, power and throttle reasons
before and after. It is placed against its access pattern's ceiling at its own tensor size (the ceilings are
measured at every size of the matrix; the nearest measured size only for a size outside it) and gets a
``regime``: ``latency`` where that ceiling is below half the pattern's plateau, so bandwidth is not what
sets the time (no percentage, not judged against the ceiling), else ``bandwidth``.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import gpulab.bench.impls  # noqa: F401 - registers the implementations
from gpulab.bench.correctness import (
    Prepared,
    check_case,
    check_output,
    prepare,
    snapshot,
    tolerance_for,
)
from gpulab.bench.ops import Shape, op_spec
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Registry
from gpulab.ceilings import MISS, STATE_COLUMNS, Ceilings, Hit, placement
from gpulab.device import DeviceInfo, synchronize
from gpulab.dtypes import ITEMSIZE, torch_dtype
from gpulab.smi import gpu_state, state_text, throttled
from gpulab.tables import Column, TableSchema
from gpulab.timing import TimingSettings, measure, rotation_sets

log = logging.getLogger(__name__)

BENCH = TableSchema(
    "bench",
    (
        Column("op", "str", "gelu | softmax | add"),
        Column("impl", "str", "manual | native | cpp_ext | triton | torch_compile"),
        Column("size", "str", "shape: N elements, or ROWSxCOLS for softmax"),
        Column("numel", "int", "elements per input tensor"),
        Column("dtype", "str", "fp32 | fp16 | bf16"),
        Column("tensor_bytes", "int", "bytes of one input tensor"),
        Column("bytes_moved", "int", "fewest bytes the op must move: inputs read once + output written once"),
        Column("flops", "int", "floating-point operations (tanh/exp counted as one)"),
        Column("device", "str", "device name the row ran on"),
        Column("pattern", "str", "memory-access pattern of its ceiling: copy (1 read + 1 write) | add (2 reads + "
               "1 write)"),
        Column("rel_err", "float", "||out - ref|| / ||ref|| against float64, fresh random inputs (worst of the "
               "checked call and the last timed call)"),
        Column("max_abs_err", "float", "max |out - ref|"),
        Column("element_err_ratio", "float", "max over elements of |out - ref| / (atol + rtol |ref|): above 1 fails"),
        Column("nonfinite", "int", "outputs that were NaN/inf after the call (poisoned and unwritten)"),
        Column("tolerance", "float", "rel_err bound for this dtype"),
        Column("cold_call_ms", "float", "first call of this case in its job: compilation/autotuning/JIT included, "
               "unless the compiler caches under .cache/ (gpulab.paths) already held them from an earlier run"),
        Column("gbps", "float", "bytes_moved / median time, GB/s (1e9 B/s)"),
        Column("gbps_p90", "float", "GB/s at the p10 time (the fast end of the spread)"),
        Column("gbps_p10", "float", "GB/s at the p90 time (the slow end of the spread)"),
        Column("gflops", "float", "flops / median time, GFLOP/s"),
        Column("ceiling_gbps", "float", "the pattern's measured ceiling at this row's tensor size "
               "(bench/ceilings.csv: best of several methods)"),
        Column("ceiling_bytes", "int", "tensor size that ceiling was measured at: tensor_bytes (exact), or the "
               "nearest measured size when the ceilings were measured for another matrix"),
        Column("ceiling_method", "str", "the method that set that ceiling"),
        Column("regime", "str", "bandwidth | latency: the ceiling at this size is below half the pattern's "
               "plateau (its ceiling at the largest size, same dtype): launch and first-access latency, not "
               "bandwidth, set the time"),
        Column("pct_of_ceiling", "float", "gbps as a percentage of ceiling_gbps; empty for latency rows"),
        Column("above_ceiling", "bool", "gbps exceeds the ceiling by more than the spread (p90/p10) of both: "
               "then the ceiling is not trustworthy; empty for latency rows (not judged)"),
        Column("method", "str", "how the time was taken: timer, cache policy, reps"),
        *STATE_COLUMNS,
    ),
    measured=True,
)
# Row order of the aggregated tables: the baseline first, then by how far from PyTorch they are.
IMPL_ORDER = ("native", "manual", "torch_compile", "triton", "cpp_ext")


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def _free_memory(device: str) -> None:
    gc.collect()
    if device != "cpu":
        import torch

        torch.cuda.empty_cache()


def _short(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text}"[:400]


def case_rows_base(case: Case, *, target: str, fingerprint: str, device_name: str) -> dict[str, Any]:
    spec = op_spec(case.op)
    itemsize = ITEMSIZE[case.dtype]
    return {
        "target": target, "fingerprint": fingerprint, "op": case.op, "impl": case.impl, "size": case.label,
        "numel": spec.numel(case.shape), "dtype": case.dtype, "tensor_bytes": spec.numel(case.shape) * itemsize,
        "bytes_moved": spec.bytes_moved(case.shape, itemsize), "flops": spec.flops(case.shape),
        "pattern": spec.pattern, "device": device_name,
    }


def _timed_and_checked(case: Case, ctx: BenchContext, settings: TimingSettings, registry: Registry,
                       tolerance: float, seed: int) -> dict[str, Any]:
    """Gate, time the checked closure (rotated with closures over further input sets), check the last timed call."""
    spec = op_spec(case.op)
    impl = registry.get(case.op, case.impl)
    dtype = torch_dtype(case.dtype)
    first = prepare(impl, case, spec.make_inputs(case.shape, dtype, case.device, seed=seed))
    gate, saved = check_case(case, first, tolerance)
    row: dict[str, Any] = gate.as_row()
    if not gate.passed:
        return {**row, "status": "incorrect", "reason": gate.reason}
    bytes_per_set = spec.n_inputs * spec.numel(case.shape) * ITEMSIZE[case.dtype]
    n_sets = rotation_sets(settings, ctx.info, bytes_per_set)
    sets: list[Prepared] = [first] + [prepare(impl, case, spec.make_inputs(case.shape, dtype, case.device,
                                                                           seed=seed + 1 + i))
                                      for i in range(n_sets - 1)]
    synchronize(case.device)
    before = gpu_state(ctx.info.backend)
    last: list[tuple[int, object]] = []
    timing = measure([p.closure for p in sets], settings, ctx.info, last=last)
    after = gpu_state(ctx.info.backend)
    index, result = last[0]
    # The inputs of the last timed call are checked against the first set's snapshot only when that is
    # the set it used; other sets are checked for the output value.
    again = check_output(case, sets[index], result, saved if index == 0 else snapshot(sets[index].inputs),
                         tolerance)
    row.update({"rel_err": max(gate.rel_err, again.rel_err), "element_err_ratio":
                max(gate.element_ratio, again.element_ratio), "max_abs_err": max(gate.max_abs_err, again.max_abs_err)})
    row.update(gpu_before=state_text(before), gpu_after=state_text(after), throttled=throttled(before, after))
    if not again.passed:
        return {**row, "status": "incorrect", "reason": f"the last timed call: {again.reason}"}
    return {**row, "status": "ok", "reason": "", **timing.as_row()}


def run_case(
    case: Case,
    ctx: BenchContext,
    settings: TimingSettings,
    *,
    registry: Registry = REGISTRY,
    tolerances: Mapping[str, float] | None = None,
    ceiling: Hit = MISS,
    seed: int = 0,
) -> dict[str, Any]:
    """One checked, timed case as a row (without the target/fingerprint columns)."""
    spec = op_spec(case.op)
    tolerance = tolerance_for(case.dtype, tolerances)
    try:
        row = {"tolerance": tolerance, **_timed_and_checked(case, ctx, settings, registry, tolerance, seed)}
    except Exception as exc:
        status = "oom" if is_oom(exc) else "failed"
        log.warning("%s %s %s %s: %s", case.op, case.impl, case.label, case.dtype, _short(exc))
        if status == "failed":
            log.debug("traceback", exc_info=True)
        return {"tolerance": tolerance, "status": status, "reason": _short(exc)}
    finally:
        _free_memory(case.device)
    if row["status"] != "ok":
        return row
    bytes_moved = spec.bytes_moved(case.shape, ITEMSIZE[case.dtype])
    gbps = bytes_moved / (row["median_ms"] / 1e3) / 1e9
    return {
        **row,
        "gbps": gbps,
        "gbps_p90": bytes_moved / (row["p10_ms"] / 1e3) / 1e9,
        "gbps_p10": bytes_moved / (row["p90_ms"] / 1e3) / 1e9,
        "gflops": spec.flops(case.shape) / (row["median_ms"] / 1e3) / 1e9,
        **placement(gbps, ceiling, row["p90_ms"] / row["p10_ms"]),
        "method": f"{row['timer']}, median of {row['reps']} reps, cache {row['cache_policy']}",
    }


def run_cell(
    op: str,
    impl_name: str,
    *,
    shapes: Sequence[Shape],
    dtypes: Sequence[str],
    settings: TimingSettings,
    ctx: BenchContext,
    fingerprint: str,
    ceilings: Ceilings | None = None,
    registry: Registry = REGISTRY,
    tolerances: Mapping[str, float] | None = None,
    deadline: float | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """All cases of one (op, implementation): one row per shape x dtype.

    ``deadline`` (a ``time.monotonic()`` value) turns the cases not started by then into ``skipped``
    rows saying so, for runs under a wall-clock budget.
    """
    from tqdm import tqdm

    impl = registry.get(op, impl_name)
    device = ctx.info.torch_device
    unavailable = impl.unavailable(ctx)
    rows: list[dict[str, Any]] = []
    cases = [Case(op, impl_name, tuple(shape), dtype, device) for shape in shapes for dtype in dtypes]
    for i, case in enumerate(tqdm(cases, desc=f"{op}/{impl_name}", disable=not progress, mininterval=5)):
        base = case_rows_base(case, target=ctx.target, fingerprint=fingerprint, device_name=ctx.info.name)
        if unavailable is not None:
            rows.append({**base, "status": unavailable.status, "reason": unavailable.reason,
                         "tolerance": tolerance_for(case.dtype, tolerances)})
            continue
        if deadline is not None and time.monotonic() > deadline:
            rows.append({**base, "status": "skipped", "reason": "the run's time budget was spent before this case"})
            continue
        tensor_bytes = base["tensor_bytes"]
        ceiling = ceilings.lookup(op_spec(op).pattern, case.dtype, tensor_bytes) if ceilings is not None else MISS
        row = run_case(case, ctx, settings, registry=registry, tolerances=tolerances, ceiling=ceiling,
                       seed=1000 * i + 17)
        rows.append({**base, **row})
        log.info("%s %s %s %s: %s %s", op, impl_name, case.label, case.dtype, row["status"],
                 f"{row['median_ms']:.4g} ms, {row['gbps']:.4g} GB/s" if row["status"] == "ok" else row["reason"])
    return rows


def aggregate(cell_paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate the cells of one op into its tidy table, ordered impl / size / dtype."""
    frames = [BENCH.read(p) for p in cell_paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return BENCH.frame([])
    df = pd.concat(frames, ignore_index=True)
    # Vector sizes read back as integers, softmax shapes as text: one type for the column.
    df["size"] = df["size"].astype(str)
    order = {name: i for i, name in enumerate(IMPL_ORDER)}
    dtype_order = {"fp32": 0, "fp16": 1, "bf16": 2}
    df = df.assign(_impl=df["impl"].map(order).fillna(len(order)), _dtype=df["dtype"].map(dtype_order).fillna(3))
    df = df.sort_values(["target", "_impl", "impl", "numel", "size", "_dtype"], kind="stable")
    return df.drop(columns=["_impl", "_dtype"]).reset_index(drop=True)


def bench_cell_job(
    op: str,
    impl: str,
    *,
    bench_config: Mapping[str, Any],
    timing_config: Mapping[str, Any],
    target: str,
    fingerprint: str,
    ceilings_path: str | Path | None,
    out_path: str | Path,
    info: DeviceInfo | None = None,
) -> pd.DataFrame:
    """What the Snakemake job of one (target, op, impl) does: resolve sizes, run, write the cell CSV."""
    from gpulab.bench.sizes import resolve_sizes
    from gpulab.device import detect

    info = info or detect()
    shapes = resolve_sizes(op, bench_config.get("sizes", "auto"), info, bench_config.get("max_tensor_mib", "auto"))
    log.info("%s/%s on %s (%s): %d sizes x %d dtypes", op, impl, info.name, info.backend, len(shapes),
             len(bench_config["dtypes"]))
    rows = run_cell(
        op, impl, shapes=shapes, dtypes=list(bench_config["dtypes"]),
        settings=TimingSettings.from_config(timing_config), ctx=BenchContext(info, target),
        fingerprint=fingerprint, ceilings=Ceilings.load(ceilings_path) if ceilings_path else None,
        tolerances=bench_config.get("tolerances"),
    )
    return BENCH.write(rows, out_path)
