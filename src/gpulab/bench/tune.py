"""Rule ``tune_triton_op``: every launch candidate of the Triton kernels, checked and timed beside the one the
benchmark makes.

Each candidate of the device family (the elementwise autotune list; softmax's ``launch_candidates``) is an
implementation pinned to that launch, run through :func:`gpulab.bench.runner.run_case` at the matrix's sizes; rows
say which launch the benchmark picks (``picked``) and which is the fastest of its case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.bench.impls import triton_launcher
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Registry
from gpulab.bench.runner import BENCH, case_rows_base, run_case
from gpulab.core.ceilings import MISS, Ceilings
from gpulab.core.device import DeviceInfo
from gpulab.core.dtypes import ITEMSIZE, torch_dtype
from gpulab.core.ops import op_spec
from gpulab.core.tables import Column, TableSchema
from gpulab.core.timing import TimingSettings

log = logging.getLogger(__name__)

TUNE_TRITON = TableSchema(
    "tune_triton",
    (
        Column("config", "str", "the launch: BLOCK_SIZE and num_warps (gelu, add); BLOCK_M, BLOCK_N and num_warps "
               "of the fused kernel, SPLIT, BLOCK_N and num_warps of the split one or BLOCK_N and num_warps of the "
               "looped one (softmax); empty when skipped"),
        Column("picked", "bool", "the launch the benchmark makes for this case: Triton's autotuner pick in the "
               "benchmark's own call (gelu, add), launch_choice (softmax)"),
        Column("fastest", "bool", "the lowest median time of the case's ok candidates"),
        *BENCH.columns,
    ),
    measured=True,
    path="tune/triton.csv",
)

def candidates(case: Case) -> list[tuple[str, dict[str, Any]]]:
    """(label, the launcher's keyword arguments) of every launch of the running family for one case: the kernel
    module's own ``launch_candidates`` (softmax), else its family's elementwise list."""
    from gpulab.kernels.triton.config import current_target, elementwise_label, elementwise_shapes

    kernels = op_spec(case.op).triton_kernels()
    if hasattr(kernels, "launch_candidates"):
        return [(c.label, c.overrides()) for c in kernels.launch_candidates(*case.shape, ITEMSIZE[case.dtype],
                                                                            current_target())]
    return [(elementwise_label(b, w), {"block_size": b, "num_warps": w}) for b, w in elementwise_shapes()]


def picked(case: Case) -> str:
    """The label of the launch the benchmark makes for ``case``: the kernel module's ``launch_choice`` (softmax),
    or, for an elementwise kernel, its autotuner's pick in its first unpinned call per size and dtype (the
    benchmark's own closure runs once, then the choice is read back)."""
    from gpulab.kernels.triton.config import current_target, elementwise_label, launched_shape

    spec = op_spec(case.op)
    kernels = spec.triton_kernels()
    if hasattr(kernels, "launch_choice"):
        return kernels.launch_choice(*case.shape, ITEMSIZE[case.dtype], current_target()).label
    inputs = spec.make_inputs(case.shape, torch_dtype(case.dtype), case.device, seed=0)
    REGISTRY.get(case.op, "triton").factory(case, inputs, None)()
    return elementwise_label(*launched_shape(getattr(kernels, f"{case.op}_kernel")))


def pinned(op: str, overrides: Mapping[str, Any]) -> Registry:
    """A registry whose ``triton`` implementation of ``op`` always makes one launch."""
    registry, launcher = Registry(), triton_launcher(op)
    triton = REGISTRY.get(op, "triton")

    @registry.register(op, "triton", writes_out=True, availability=triton.availability)
    def launch(case: Case, inputs: Any, out: Any) -> Callable[[], Any]:
        return lambda: launcher(*inputs, out, **overrides)

    return registry


def mark_fastest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``fastest`` on the ok row of lowest median (False on the other ok rows, empty on the rest)."""
    ok = [r for r in rows if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["median_ms"]) if ok else None
    return [{**r, "fastest": r is best if r["status"] == "ok" else None} for r in rows]


def tune_case(case: Case, ctx: BenchContext, settings: TimingSettings, base: dict[str, Any], *,
              ceilings: Ceilings | None, tolerances: Mapping[str, float] | None, seed: int) -> list[dict[str, Any]]:
    """Every candidate of one case, each checked and timed on the same inputs (the same seed)."""
    try:
        choice = picked(case)
    except Exception as exc:  # the candidates still run; each records its own failure
        log.warning("%s %s %s: the benchmark's launch failed: %s", case.op, case.label, case.dtype, exc)
        choice = None
    ceiling = ceilings.lookup(op_spec(case.op).pattern, case.dtype, base["tensor_bytes"]) if ceilings else MISS
    rows = []
    for label, overrides in candidates(case):
        row = run_case(case, ctx, settings, registry=pinned(case.op, overrides), tolerances=tolerances,
                       ceiling=ceiling, seed=seed)
        rows.append({**base, "config": label, "picked": None if choice is None else label == choice, **row})
        log.info("%s %s %s %s: %s %s", case.op, case.label, case.dtype, label, row["status"],
                 f"{row['median_ms']:.4g} ms" if row["status"] == "ok" else row["reason"])
    return mark_fastest(rows)


def tune_op(op: str, shapes: Iterable[tuple[int, ...]], dtypes: Iterable[str], settings: TimingSettings,
            ctx: BenchContext, fingerprint: str, *, ceilings: Ceilings | None = None,
            tolerances: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """All cases of one op: every candidate's row, or one row per case saying why Triton cannot run here."""
    unavailable = REGISTRY.get(op, "triton").unavailable(ctx)
    rows: list[dict[str, Any]] = []
    cases = [Case(op, "triton", tuple(s), d, ctx.info.torch_device) for s in shapes for d in dtypes]
    for i, case in enumerate(cases):
        base = case_rows_base(case, target=ctx.target, fingerprint=fingerprint, device_name=ctx.info.name)
        if unavailable is not None:
            rows.append({**base, "config": "", "status": unavailable.status, "reason": unavailable.reason})
            continue
        rows += tune_case(case, ctx, settings, base, ceilings=ceilings, tolerances=tolerances, seed=1000 * i + 17)
    return rows


def tune_triton_job(op: str, *, bench_config: Mapping[str, Any], timing_config: Mapping[str, Any], target: str,
                    fingerprint: str, ceilings_path: str | Path, out_path: str | Path,
                    info: DeviceInfo | None = None) -> pd.DataFrame:
    """What the Snakemake job of one (target, op) does: the bench cells' sizes and dtypes, every candidate."""
    from gpulab.bench.sizes import resolve_sizes
    from gpulab.core.device import detect

    info = info or detect()
    shapes = resolve_sizes(op, bench_config.get("sizes", "auto"), info, bench_config.get("max_tensor_mib", "auto"))
    rows = tune_op(op, shapes, list(bench_config["dtypes"]), TimingSettings.from_config(timing_config),
                   BenchContext(info, target), fingerprint, ceilings=Ceilings.load(ceilings_path),
                   tolerances=bench_config.get("tolerances"))
    return TUNE_TRITON.write(rows, out_path)


def aggregate(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The ops' tables as one (``tune/triton.csv``), in the order given."""
    frames = [TUNE_TRITON.read(p) for p in paths]
    frames = [f.assign(size=f["size"].astype(str)) for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else TUNE_TRITON.frame([])
