"""Run one cell of the matrix (an op x implementation over all sizes and dtypes): check, then time.

Each case is gated (:mod:`gpulab.bench.correctness`), timed with the one timing function over the very closure
that was checked, checked again, and becomes exactly one row whatever happens (ok, incorrect, oom, skipped, failed),
placed against its pattern's ceiling at its own size with a ``regime``. The method is in docs/methodology/
(timing.md, ceilings.md, correctness.md).
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.bench.correctness import (
    CheckResult,
    Prepared,
    check_case,
    check_output_again,
    prepare,
    snapshot,
    tolerance_for,
)
from gpulab.bench.impls import in_row_order  # importing it registers the implementations
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Impl, Registry
from gpulab.core import energy
from gpulab.core.ceilings import (
    BESIDE_THE_CASE,
    CEILINGS,
    MISS,
    PATTERN_TRANSFERS,
    STATE_COLUMNS,
    Ceilings,
    Hit,
    ceiling_rate,
    placement,
    raised_rows,
    reference_closures,
    share_ceilings,
)
from gpulab.core.datasheet import pct_of_datasheet
from gpulab.core.device import DeviceInfo, synchronize
from gpulab.core.dtypes import ITEMSIZE, torch_dtype
from gpulab.core.energy import ENERGY_SPAN_S, per_unit
from gpulab.core.ops import Shape, op_spec
from gpulab.core.smi import gpu_state, state_text, throttled
from gpulab.core.tables import Column, TableSchema
from gpulab.core.timing import (
    BLOCK_SEPARATOR,
    CacheFlusher,
    Measurement,
    TimingSettings,
    parse_times,
    rotation_sets,
    summarize,
)

log = logging.getLogger(__name__)

# Memory the cases of one interleaved group may hold at once (rotated inputs, outputs, input snapshots):
# on a GPU a fraction of its memory, so a cell of GiB-sized cases is timed a few at a time.
GPU_INTERLEAVE_FRACTION = 0.125
CPU_INTERLEAVE_BYTES = 2 * 2**30
# The reference timed beside a case (timing.reference) serves by the median of each of its blocks, not by its
# distribution, so it gets a quarter of the case's time, and enough repetitions that each block has a median.
REFERENCE_SHARE = 0.25
REFERENCE_REPS_PER_BLOCK = 3
# What the energy columns of an (op, implementation, dtype)'s other sizes say: its energy is measured once, at its
# largest size, over a block spanning ENERGY_SPAN_S (a bench case's timed blocks span a fraction of a second).
ENERGY_AT_LARGEST = "energy measured at the largest size"

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
               "unless the compiler caches under .cache/ (gpulab.core.paths) already held them from an earlier run"),
        Column("gbps", "float", "bytes_moved / median time, GB/s (1e9 B/s)"),
        Column("gbps_p90", "float", "GB/s at the p10 time (the fast end of the spread)"),
        Column("gbps_p10", "float", "GB/s at the p90 time (the slow end of the spread)"),
        Column("gflops", "float", "flops / median time, GFLOP/s"),
        Column("ceiling_gbps", "float", "the pattern's measured ceiling at this row's tensor size, one for every table "
               "(gpulab.core.ceilings.share_ceilings): the best of the dedicated methods "
               "(dedicated_ceiling_gbps), or the "
               "fastest row of any op of the same pattern, dtype and size where that row beat them all "
               "(ceiling_method then names it)"),
        Column("dedicated_ceiling_gbps", "float", "the best of the dedicated ceiling methods at this size "
               f"({CEILINGS.path}, or a reference timed beside a case of this size where that was faster)"),
        Column("ceiling_bytes", "int", "tensor size that ceiling was measured at: tensor_bytes (exact), or the "
               "nearest measured size when the ceilings were measured for another matrix"),
        Column("ceiling_method", "str", "the method that set that ceiling"),
        Column("ceiling_spread", "float", "p90/p10 of that ceiling's repetition times (the invariant allows a row "
               "above it by the spread of both)"),
        Column("regime", "str", "bandwidth | latency: the ceiling at this size is below half the pattern's "
               "plateau (its ceiling at the largest size, same dtype): launch and first-access latency, not "
               "bandwidth, set the time"),
        Column("pct_of_ceiling", "float", "gbps as a percentage of ceiling_gbps; empty for latency rows"),
        Column("above_ceiling", "bool", "gbps exceeds the dedicated ceiling by more than the spread (p90/p10) of both: "
               "then the ceiling is not trustworthy; empty for latency rows (not judged)"),
        Column("datasheet_gbps", "float", "the device's datasheet memory bandwidth "
               "(gpulab.core.datasheet); empty where "
               "the device is not listed"),
        Column("pct_of_datasheet", "float", "gbps as a percentage of datasheet_gbps"),
        Column("gb_per_j", "float", "bytes_moved per joule of device energy (GB/J): energy_j of one call, measured at "
               "the (op, implementation, dtype)'s largest size over a block of at least 1.5 s; empty at its other "
               "sizes (energy_reason: energy measured at the largest size) and where unknown (energy_reason says why)"),
        Column("method", "str", "how the time was taken: timer, cache policy, reps"),
        Column("reference_method", "str", "the pattern's reference method timed beside the case, a block of it "
               "after each of the case's (timing.reference; empty where off): memcpy | torch.add"),
        Column("reference_gbps", "float", "the reference's GB/s at the case's tensor size and dtype, in the case's "
               "span, at its fastest decile as every ceiling method; where above the ceilings job's figure it is the "
               "row's ceiling"),
        Column("reference_times_ms", "str", "the reference's repetition times, blocks separated by | and paired "
               "with the case's: gpulab compare judges the case's time relative to them"),
        *STATE_COLUMNS,
    ),
    measured=True,
    path="bench/{op}.csv",
)


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


@dataclass
class _Pending:
    """A case checked by the gate and being timed: everything needed to check its last timed call."""

    index: int
    case: Case
    sets: list[Prepared]
    saved: list[Any]
    gate: CheckResult
    kept: Any = None  # the gate's output (CPU only): a bit-identical last timed call reuses its check
    measurement: Measurement | None = None
    reference: Measurement | None = None  # the pattern's reference method, a block beside each of the case's
    reference_method: str = ""


def _gate(index: int, case: Case, ctx: BenchContext, settings: TimingSettings, registry: Registry,
          tolerance: float, seed: int) -> tuple[dict[str, Any], _Pending | None]:
    """Check the case on fresh inputs; a passing case gets its rotation sets (the checked closure first)."""
    spec = op_spec(case.op)
    impl = registry.get(case.op, case.impl)
    dtype = torch_dtype(case.dtype)
    first = prepare(impl, case, spec.make_inputs(case.shape, dtype, case.device, seed=seed))
    # On a CPU the gate's output is kept (host memory; cheaper than recomputing the float64 reference after
    # timing); on a GPU it would hold device memory beside the timed cases, so there the check is redone.
    gate, saved, kept = check_case(case, first, tolerance, keep=keeps_gate_output(ctx.info))
    row: dict[str, Any] = {"tolerance": tolerance, **gate.as_row()}
    if not gate.passed:
        return {**row, "status": "incorrect", "reason": gate.reason}, None
    n_sets = rotation_sets(settings, ctx.info, _set_bytes(case))
    sets = [first] + [prepare(impl, case, spec.make_inputs(case.shape, dtype, case.device, seed=seed + 1 + i))
                      for i in range(n_sets - 1)]
    return row, _Pending(index, case, sets, saved, gate, kept)


def keeps_gate_output(info: DeviceInfo) -> bool:
    """Whether the gate keeps a copy of its checked output for the check of the last timed call."""
    return not info.gpu_available


def _tensor_bytes(case: Case) -> int:
    """Bytes of one tensor of the case (an input, or its output)."""
    return op_spec(case.op).numel(case.shape) * ITEMSIZE[case.dtype]


def _set_bytes(case: Case) -> int:
    return op_spec(case.op).n_inputs * _tensor_bytes(case)


def _checked_row(pending: _Pending) -> dict[str, Any]:
    """The timed row, once the last timed call's output and inputs are checked again."""
    assert pending.measurement is not None
    index, result = pending.measurement.last
    # The inputs of the last timed call are checked against the first set's snapshot only when that is
    # the set it used; other sets are checked for the output value.
    saved = pending.saved if index == 0 else snapshot(pending.sets[index].inputs)
    gate = pending.gate.as_row()
    # Set 0 is the one the gate checked: the same bits from it pass with the gate's figures.
    again = check_output_again(pending.case, pending.sets[index], result, saved, pending.gate.tolerance,
                               pending.kept if index == 0 else None, pending.gate)
    row = {**gate, "rel_err": max(gate["rel_err"], again.rel_err),
           "element_err_ratio": max(gate["element_err_ratio"], again.element_ratio),
           "max_abs_err": max(gate["max_abs_err"], again.max_abs_err)}
    if not again.passed:
        return {**row, "status": "incorrect", "reason": f"the last timed call: {again.reason}"}
    return {**row, "status": "ok", "reason": "", **pending.measurement.timing().as_row(), **_reference_row(pending)}


def _reference_row(pending: _Pending) -> dict[str, Any]:
    if pending.reference is None:
        return {}
    return {"reference_method": pending.reference_method, "reference_times_ms": pending.reference.timing().times_ms}


def _failure(case: Case, exc: BaseException, tolerance: float) -> dict[str, Any]:
    status = "oom" if is_oom(exc) else "failed"
    log.warning("%s %s %s %s: %s", case.op, case.impl, case.label, case.dtype, _short(exc))
    if status == "failed":
        log.debug("traceback", exc_info=True)
    return {"tolerance": tolerance, "status": status, "reason": _short(exc)}


def _with_reference(case: Case, row: dict[str, Any], ceiling: Hit) -> tuple[dict[str, Any], Hit]:
    """The row with its reference's rate, and the ceiling raised to that reference where it was faster than
    the ceilings job's methods (timed beside the case, it met the machine in the case's own state)."""
    if not row.get("reference_times_ms"):
        return row, ceiling
    stats = summarize(parse_times(row["reference_times_ms"]))
    tensor_bytes = _tensor_bytes(case)
    reference = ceiling_rate(PATTERN_TRANSFERS[op_spec(case.op).pattern] * tensor_bytes, stats)
    if not math.isnan(ceiling.gbps) and reference > ceiling.gbps:
        ceiling = Hit(reference, tensor_bytes, f"{row['reference_method']} {BESIDE_THE_CASE}",
                      stats["p90_ms"] / stats["p10_ms"], ceiling.plateau)
    return {**row, "reference_gbps": reference}, ceiling


def _with_figures(case: Case, row: dict[str, Any], ceiling: Hit) -> dict[str, Any]:
    """An ok row with its rates and its place against the ceiling; other rows as they are."""
    if row["status"] != "ok":
        return row
    row, ceiling = _with_reference(case, row, ceiling)
    spec = op_spec(case.op)
    bytes_moved = spec.bytes_moved(case.shape, ITEMSIZE[case.dtype])
    gbps = bytes_moved / (row["median_ms"] / 1e3) / 1e9
    blocks = row["times_ms"].count(BLOCK_SEPARATOR) + 1
    reference = f", each block beside one of {row['reference_method']}" if row.get("reference_method") else ""
    return {
        **row,
        "gbps": gbps,
        "gbps_p90": bytes_moved / (row["p10_ms"] / 1e3) / 1e9,
        "gbps_p10": bytes_moved / (row["p90_ms"] / 1e3) / 1e9,
        "gflops": spec.flops(case.shape) / (row["median_ms"] / 1e3) / 1e9,
        "gb_per_j": per_unit(row.get("energy_j", math.nan), bytes_moved / 1e9),
        **placement(gbps, ceiling, row["p90_ms"] / row["p10_ms"]),
        "method": f"{row['timer']}, median of {row['reps']} reps in {blocks} blocks taken in turn with the "
                  f"cell's other cases{reference}, cache {row['cache_policy']}",
    }


def energy_notes(cases: Sequence[Case]) -> dict[int, str]:
    """Per case index, what its energy columns say where the case is not its (op, implementation, dtype)'s largest
    size (ENERGY_AT_LARGEST and that size); the largest case of each dtype is absent: its energy is measured."""
    largest: dict[str, int] = {}
    for i, case in enumerate(cases):
        best = largest.get(case.dtype)
        if best is None or op_spec(case.op).numel(case.shape) > op_spec(cases[best].op).numel(cases[best].shape):
            largest[case.dtype] = i
    return {i: f"{ENERGY_AT_LARGEST} ({cases[largest[case.dtype]].label})" for i, case in enumerate(cases)
            if i != largest[case.dtype]}


def _time_group(cases: Sequence[tuple[int, Case, int]], ctx: BenchContext, settings: TimingSettings,
                registry: Registry, tolerances: Mapping[str, float] | None,
                span_s: float = 0.0, notes: Mapping[int, str] | None = None) -> dict[int, dict[str, Any]]:
    """Gate every case of the group, then time the passing ones together, a block of each in turn over at
    least ``span_s`` (see run_cell), then the energy blocks of the cases without a note (``notes``: what the
    energy columns of the others say); returns each case's row (without figures) by its index in the cell."""
    rows: dict[int, dict[str, Any]] = {}
    pending: list[_Pending] = []
    notes = notes or {}
    flusher = CacheFlusher(ctx.info, settings.flush_cache)
    for index, case, seed in cases:
        tolerance = tolerance_for(case.dtype, tolerances)
        try:
            rows[index], checked = _gate(index, case, ctx, settings, registry, tolerance, seed)
            if checked is not None:
                note = notes.get(index, "")
                timed = settings if note else replace(settings, energy_span_s=ENERGY_SPAN_S)
                checked.measurement = Measurement(
                    [p.closure for p in checked.sets], timed, ctx.info, flusher, interleaved=True,
                    footprint_bytes=_set_bytes(case) + _tensor_bytes(case),
                    energy_note=note)
                if settings.reference:
                    _add_reference(checked, settings, ctx.info, flusher)
                pending.append(checked)
        except Exception as exc:
            rows[index] = _failure(case, exc, tolerance)
    synchronize(ctx.info)
    before = gpu_state(ctx.info.backend)
    for item, exc in _interleave(pending, span_s):
        rows[item.index] = _failure(item.case, exc, item.gate.tolerance)
        pending.remove(item)
    after = gpu_state(ctx.info.backend)
    for item in list(pending):  # after every case's blocks: an energy block's load would slow the blocks after it
        try:
            assert item.measurement is not None
            item.measurement.sustain_energy()
        except Exception as exc:
            rows[item.index] = _failure(item.case, exc, item.gate.tolerance)
            pending.remove(item)
    state = {"gpu_before": state_text(before), "gpu_after": state_text(after), "throttled": throttled(before, after)}
    for timed in pending:
        try:
            rows[timed.index] = {**_checked_row(timed), **state}
        except Exception as exc:
            rows[timed.index] = _failure(timed.case, exc, timed.gate.tolerance)
    return rows


def reference_settings(settings: TimingSettings, info: DeviceInfo) -> TimingSettings:
    """A share of the case's time and wall budget (``settings`` resolved for ``info``), and at least
    REFERENCE_REPS_PER_BLOCK repetitions a block."""
    least = max(settings.min_reps, REFERENCE_REPS_PER_BLOCK * settings.blocks)
    return replace(settings, min_time_s=float(settings.min_time_s) * REFERENCE_SHARE, min_reps=least,
                   max_wall_s=float(settings.max_wall_s) * REFERENCE_SHARE, max_reps=max(settings.max_reps, least))


def _add_reference(pending: _Pending, settings: TimingSettings, info: DeviceInfo, flusher: CacheFlusher) -> None:
    """The pattern's reference method at the case's size and dtype, in as many blocks as the case."""
    name, closures = reference_closures(op_spec(pending.case.op).pattern, pending.case.dtype,
                                        _tensor_bytes(pending.case), settings, info)
    pending.reference_method = name
    pending.reference = Measurement(closures, reference_settings(settings, info), info, flusher, interleaved=True,
                                    footprint_bytes=_set_bytes(pending.case) + _tensor_bytes(pending.case),
                                    energy_note="not read: a reference timed beside the case")
    assert pending.measurement is not None
    pending.reference.pair_with(pending.measurement)


def _interleave(pending: Sequence[_Pending], span_s: float) -> list[tuple[_Pending, BaseException]]:
    """Block 1 of every measurement, then block 2, ...; rounds are paced so that all the planned ones would span at
    least ``span_s``; a measurement leaves the rotation once its stopping rule says so, or when it raises."""
    failed: list[tuple[_Pending, BaseException]] = []
    active = list(pending)
    rounds = max((len(item.measurement.plan) for item in active if item.measurement), default=0)
    start = time.monotonic()
    for done in range(1, rounds + 1):
        for item in list(active):
            assert item.measurement is not None
            try:
                item.measurement.step()
                if item.reference is not None:
                    item.reference.step()
            except Exception as exc:
                failed.append((item, exc))
                active.remove(item)
                continue
            if item.measurement.done:
                active.remove(item)
        if active:
            time.sleep(max(0.0, start + span_s * done / rounds - time.monotonic()))
    return failed


def _groups(cases: Sequence[tuple[int, Case, int]], settings: TimingSettings,
            info: DeviceInfo) -> list[list[tuple[int, Case, int]]]:
    """Consecutive cases whose rotated inputs, outputs and input snapshots fit the interleaving budget."""
    budget = GPU_INTERLEAVE_FRACTION * (info.total_memory_bytes or 0) if info.gpu_available else CPU_INTERLEAVE_BYTES
    groups: list[list[tuple[int, Case, int]]] = []
    used = math.inf
    for item in cases:
        case = item[1]
        out_bytes = _tensor_bytes(case)
        need = (rotation_sets(settings, info, _set_bytes(case)) + 1) * (_set_bytes(case) + out_bytes)
        need += out_bytes if keeps_gate_output(info) else 0
        if settings.reference:  # the reference's input sets and outputs, of the same sizes
            need += rotation_sets(settings, info, _set_bytes(case)) * (_set_bytes(case) + out_bytes)
        if used + need > budget:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += need
    return groups


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
    try:
        row = _time_group([(0, case, seed)], ctx, settings.for_device(ctx.info), registry, tolerances)[0]
    finally:
        _free_memory(case.device)
    return _with_figures(case, row, ceiling)


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
    progress: bool = True,
) -> list[dict[str, Any]]:
    """All cases of one (op, implementation): one row per shape x dtype.

    The cases are timed together, a block of each in turn (within a memory budget: larger cases form
    smaller groups), so each case's blocks are spread over the whole group's time. A change of the
    machine's state that outlasts one measurement (seen on shared CPUs: 30-60% for seconds) then shows
    as spread between blocks, which the run-vs-run comparison sees, instead of as a shift of a whole
    measurement that it cannot tell from a real change.
    """
    from tqdm import tqdm

    settings = settings.for_device(ctx.info)  # auto values resolved once, for every case of the cell
    unavailable = registry.get(op, impl_name).unavailable(ctx)
    cases = [Case(op, impl_name, tuple(shape), dtype, ctx.info.torch_device) for shape in shapes for dtype in dtypes]
    rows: dict[int, dict[str, Any]] = {}
    if unavailable is not None:
        rows = {i: {"status": unavailable.status, "reason": unavailable.reason,
                    "tolerance": tolerance_for(case.dtype, tolerances)} for i, case in enumerate(cases)}
    numbered = [(i, case, 1000 * i + 17) for i, case in enumerate(cases) if i not in rows]
    # one energy block per dtype, at its largest size, where the device has a counter (else every row says why not)
    counter = energy.counter(ctx.info.backend if ctx.info.gpu_available else "cpu")
    notes = energy_notes(cases) if not counter.reason else {}
    for group in tqdm(_groups(numbered, settings, ctx.info), desc=f"{op}/{impl_name}", disable=not progress,
                      mininterval=5):
        try:
            rows.update(_time_group(group, ctx, settings, registry, tolerances,
                                    span_s=float(settings.min_span_s), notes=notes))
        finally:
            _free_memory(ctx.info.torch_device)
    return [_cell_row(case, rows[i], ctx, fingerprint, ceilings) for i, case in enumerate(cases)]


def _cell_row(case: Case, row: dict[str, Any], ctx: BenchContext, fingerprint: str,
              ceilings: Ceilings | None) -> dict[str, Any]:
    base = case_rows_base(case, target=ctx.target, fingerprint=fingerprint, device_name=ctx.info.name)
    ceiling = ceilings.lookup(op_spec(case.op).pattern, case.dtype, base["tensor_bytes"]) if ceilings else MISS
    out = {**base, **_with_figures(case, row, ceiling)}
    if out["status"] == "ok":
        out["datasheet_gbps"], out["pct_of_datasheet"] = pct_of_datasheet(out["gbps"], base["device"])
    log.info("%s %s %s %s: %s %s", case.op, case.impl, case.label, case.dtype, out["status"],
             f"{out['median_ms']:.4g} ms, {out['gbps']:.4g} GB/s" if out["status"] == "ok" else out["reason"])
    return out


def aggregate(cell_paths: Iterable[str | Path], op: str | None = None) -> pd.DataFrame:
    """Concatenate the cells of one op into its tidy table, ordered impl / size / dtype. ``cell_paths`` are every
    op's cells of the target: each (pattern, dtype, size) gets one ceiling from all of them (share_ceilings), so
    every op's table places its rows against the same one; ``op`` picks the table (all ops when None)."""
    frames = [BENCH.read(p) for p in cell_paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return BENCH.frame([])
    df = pd.concat(frames, ignore_index=True)
    # Vector sizes read back as integers, softmax shapes as text: one type for the column.
    df["size"] = df["size"].astype(str)
    df = share_ceilings(df)
    log.info("%d of %d ok rows placed against a benchmarked row (faster than every ceiling method)",
             raised_rows(df), int((df["status"] == "ok").sum()))
    if op is not None:
        df = df[df["op"] == op]
    order = {name: i for i, name in enumerate(in_row_order())}
    dtype_order = {"fp32": 0, "fp16": 1, "bf16": 2}
    df = df.assign(_impl=df["impl"].map(order).fillna(len(order)), _dtype=df["dtype"].map(dtype_order).fillna(3))
    df = df.sort_values(["target", "_impl", "impl", "numel", "size", "_dtype"], kind="stable")
    return df.drop(columns=["_impl", "_dtype"]).reset_index(drop=True)


def compile_ahead(impl: Impl, shapes: Sequence[Shape], dtypes: Sequence[str], info: DeviceInfo) -> None:
    """Compile the kernels a cell will launch (its implementation's ``ahead``) on the probed GPU, before the job
    claims the device; a failure only leaves the compiles to the cell's first launches, which report it."""
    if impl.ahead is None or not info.gpu_available:
        return
    cases = [Case(impl.op, impl.name, tuple(shape), dtype, info.torch_device) for shape in shapes for dtype in dtypes]
    start = time.perf_counter()
    try:
        impl.ahead(cases, info)
    except Exception as exc:
        log.warning("%s/%s: compiling ahead failed (%s: %s); the first launches compile instead", impl.op,
                    impl.name, type(exc).__name__, exc)
        return
    log.info("%s/%s: %d cases compiled in %.1f s before claiming the device", impl.op, impl.name, len(cases),
             time.perf_counter() - start)


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
    from gpulab.core.device import detect, probe

    probed = info or probe()
    shapes = resolve_sizes(op, bench_config.get("sizes", "auto"), probed, bench_config.get("max_tensor_mib", "auto"))
    if info is None:  # the job's own device: compile what can be before claiming it
        compile_ahead(REGISTRY.get(op, impl), shapes, list(bench_config["dtypes"]), probed)
    info = info or detect()
    log.info("%s/%s on %s (%s): %d sizes x %d dtypes", op, impl, info.name, info.backend, len(shapes),
             len(bench_config["dtypes"]))
    rows = run_cell(
        op, impl, shapes=shapes, dtypes=list(bench_config["dtypes"]),
        settings=TimingSettings.from_config(timing_config), ctx=BenchContext(info, target),
        fingerprint=fingerprint, ceilings=Ceilings.load(ceilings_path) if ceilings_path else None,
        tolerances=bench_config.get("tolerances"),
    )
    return BENCH.write(rows, out_path)
