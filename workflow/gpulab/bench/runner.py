"""Run one cell of the matrix (an op x implementation over all sizes and dtypes): check, then time.

Each case is checked by the correctness gate on fresh inputs; only a passing case is timed, on other
fresh inputs, with the project's one timing function. Every case becomes exactly one row whatever
happens: ``ok``, ``incorrect`` (with its error figures, never timed), ``oom`` (the rest goes on),
``skipped`` (implementation unavailable here, with the reason) or ``failed`` (it raised).
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import gpulab.bench.impls  # noqa: F401 - registers the implementations
from gpulab.bench.correctness import check_case, synchronize, tolerance_for
from gpulab.bench.ops import Shape, op_spec
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Registry
from gpulab.ceilings import Ceilings, pct_of
from gpulab.device import DeviceInfo
from gpulab.dtypes import ITEMSIZE, torch_dtype
from gpulab.tables import Column, TableSchema
from gpulab.timing import TimingSettings, measure

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
        Column("rel_err", "float", "||out - ref|| / ||ref|| against float64, fresh random inputs"),
        Column("max_abs_err", "float", "max |out - ref|"),
        Column("nonfinite", "int", "outputs that were NaN/inf after the call (poisoned and unwritten)"),
        Column("tolerance", "float", "rel_err bound for this dtype"),
        Column("cold_call_ms", "float", "first call ever of this case: compilation/autotuning/JIT included"),
        Column("gbps", "float", "bytes_moved / median time, GB/s (1e9 B/s)"),
        Column("gbps_p90", "float", "GB/s at the p10 time (the fast end of the spread)"),
        Column("gbps_p10", "float", "GB/s at the p90 time (the slow end of the spread)"),
        Column("gflops", "float", "flops / median time, GFLOP/s"),
        Column("copy_gbps", "float", "measured device-to-device copy bandwidth of this dtype (bench/ceilings.csv)"),
        Column("pct_of_copy_bw", "float", "gbps as a percentage of copy_gbps"),
        Column("method", "str", "how the time was taken: timer, cache policy, reps"),
    ),
    measured=True,
)
# Row order of the aggregated tables: the baseline first, then by how far from PyTorch they are.
IMPL_ORDER = ("native", "manual", "torch_compile", "triton", "cpp_ext")
MAX_ROTATION = 8


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


def rotation_sets(settings: TimingSettings, info: DeviceInfo, bytes_per_set: int) -> int:
    """Input sets to rotate over: one when the cache is flushed before each repetition, else enough that
    the rotated inputs are twice the last-level cache (so no repetition finds its inputs cached)."""
    if settings.flush_cache:
        return 1
    cache = info.l2_cache_bytes or 64 * 2**20
    return max(1, min(MAX_ROTATION, math.ceil(2 * cache / max(1, bytes_per_set))))


def case_rows_base(case: Case, *, target: str, fingerprint: str, device_name: str) -> dict[str, Any]:
    spec = op_spec(case.op)
    itemsize = ITEMSIZE[case.dtype]
    return {
        "target": target, "fingerprint": fingerprint, "op": case.op, "impl": case.impl, "size": case.label,
        "numel": spec.numel(case.shape), "dtype": case.dtype, "tensor_bytes": spec.numel(case.shape) * itemsize,
        "bytes_moved": spec.bytes_moved(case.shape, itemsize), "flops": spec.flops(case.shape),
        "device": device_name,
    }


def run_case(
    case: Case,
    ctx: BenchContext,
    settings: TimingSettings,
    *,
    registry: Registry = REGISTRY,
    tolerances: Mapping[str, float] | None = None,
    copy_gbps: float = math.nan,
    seed: int = 0,
) -> dict[str, Any]:
    """One checked, timed case as a row (without the target/fingerprint columns)."""
    spec = op_spec(case.op)
    impl = registry.get(case.op, case.impl)
    tolerance = tolerance_for(case.dtype, tolerances)
    dtype = torch_dtype(case.dtype)
    row: dict[str, Any] = {"tolerance": tolerance}
    try:
        inputs = spec.make_inputs(case.shape, dtype, case.device, seed=seed)
        check = check_case(spec, impl, case, inputs, tolerance)
        del inputs
        row.update(check.as_row())
        if not check.passed:
            return {**row, "status": "incorrect", "reason": check.reason}
        _free_memory(case.device)
        bytes_per_set = spec.n_inputs * spec.numel(case.shape) * ITEMSIZE[case.dtype]
        sets = [spec.make_inputs(case.shape, dtype, case.device, seed=seed + 1 + i)
                for i in range(rotation_sets(settings, ctx.info, bytes_per_set))]
        closures = [impl.factory(case, ins, None) for ins in sets]
        synchronize(case.device)
        timing = measure(closures, settings, ctx.info)
        del closures, sets
    except Exception as exc:
        status = "oom" if is_oom(exc) else "failed"
        log.warning("%s %s %s %s: %s", case.op, case.impl, case.label, case.dtype, _short(exc))
        if status == "failed":
            log.debug("traceback", exc_info=True)
        return {**row, "status": status, "reason": _short(exc)}
    finally:
        _free_memory(case.device)
    seconds = timing.median_ms / 1e3
    bytes_moved = spec.bytes_moved(case.shape, ITEMSIZE[case.dtype])
    gbps = bytes_moved / seconds / 1e9
    return {
        **row,
        "status": "ok",
        "reason": "",
        "gbps": gbps,
        "gbps_p90": bytes_moved / (timing.p10_ms / 1e3) / 1e9,
        "gbps_p10": bytes_moved / (timing.p90_ms / 1e3) / 1e9,
        "gflops": spec.flops(case.shape) / seconds / 1e9,
        "copy_gbps": copy_gbps,
        "pct_of_copy_bw": pct_of(gbps, copy_gbps),
        "method": f"{timing.timer}, median of {timing.reps} reps, cache {timing.cache_policy}",
        **timing.as_row(),
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
        copy_gbps = ceilings.copy_gbps(case.dtype) if ceilings is not None else math.nan
        row = run_case(case, ctx, settings, registry=registry, tolerances=tolerances, copy_gbps=copy_gbps,
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
