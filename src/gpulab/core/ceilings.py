"""Measured hardware ceilings, per memory-access pattern (gpulab.core.patterns) and for matmul, each the best of
several methods timed with the project's timing function.

Memory patterns are measured at every tensor size the benchmark matrix uses plus the plateau size; matmul over square
and the MLP's GEMM shapes. Every method's row is kept (``best`` marks the winner); a size whose best method reaches
under half the plateau is latency-bound. The methods are in docs/methodology/ceilings.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpulab.core.device import DeviceInfo, detect
from gpulab.core.device import max_tensor_bytes as max_tensor_bytes_of
from gpulab.core.dtypes import ITEMSIZE, torch_dtype
from gpulab.core.patterns import MEMORY_PATTERNS, PATTERNS
from gpulab.core.smi import gpu_state, state_text, throttled
from gpulab.core.tables import Column, TableSchema
from gpulab.core.timing import TimingSettings, measure, rotation_sets

log = logging.getLogger(__name__)

STATE_COLUMNS = (
    Column("gpu_before", "str", "GPU clocks/temperature/power/throttle reasons before the row (JSON; or why unknown)"),
    Column("gpu_after", "str", "the same, after the row"),
    Column("throttled", "str", "yes: <reasons> | no | unknown: <why>: did the GPU throttle during the row"),
)
CEILINGS = TableSchema(
    "ceilings",
    (
        Column("kind", "str", "read (1 read) | copy (1 read + 1 write) | add (2 reads + 1 write) | matmul"),
        Column("dtype", "str", "fp32 | tf32 | fp16 | bf16"),
        Column("size", "str", "bytes per tensor (memory patterns) or MxNxK (matmul)"),
        Column("tensor_bytes", "int", "bytes of one tensor (memory patterns)"),
        Column("method", "str", "how it was measured: memcpy | torch.<op> | torch.compile | triton b<block> w<warps>"),
        Column("best", "bool", "the fastest ok method of this kind, dtype and size: the ceiling"),
        Column("bytes_moved", "int", "bytes read + written per call"),
        Column("gbps", "float", "GB/s (1e9 bytes/s) at the method's fastest decile (p10 time), memory patterns"),
        Column("tflops", "float", "TFLOP/s (2MNK flops) at the method's fastest decile (p10 time), matmul rows"),
        *STATE_COLUMNS,
    ),
    measured=True,
    path="bench/ceilings.csv",
)
# A ceiling method is rated at its fastest decile of repetitions, as STREAM and BabelStream rate a kernel by its best
# time; the rows it judges keep their medians. Rated by its median, a method that only ties the fastest of a dozen
# kernels loses to one of them most of the time, a raise that says nothing about the method (docs/decisions.md).
CEILING_TIME = "p10_ms"


def ceiling_rate(amount: float, timing: Mapping[str, Any], unit: float = 1e9) -> float:
    """``amount`` (bytes or flops) a second at a ceiling method's fastest-decile time, in ``unit`` (GB/s, TFLOP/s)."""
    return amount / (float(timing[CEILING_TIME]) / 1e3) / unit


# Per memory pattern (gpulab.core.patterns): tensor-sized transfers per element, tensors read, and the method a CPU
# bench cell times beside each of its cases, a block of each in turn (``timing.reference``).
PATTERN_TRANSFERS = {name: PATTERNS[name].transfers for name in MEMORY_PATTERNS}
PATTERN_INPUTS = {name: PATTERNS[name].inputs for name in MEMORY_PATTERNS}
REFERENCE_METHODS = {name: PATTERNS[name].reference_method for name in MEMORY_PATTERNS}
# How a row's ceiling_method names that reference where it set the row's ceiling.
BESIDE_THE_CASE = "(timed beside the case)"
MiB = 2**20
# A size is latency-bound when its ceiling is below this share of the pattern's plateau (its ceiling at the
# largest measured size): the best method itself cannot approach bandwidth there.
LATENCY_FRACTION = 0.5
SQUARE_SIDES = (4096, 8192)
# One CPU product should take at most this long: CPUs without native fp16/bf16 matrix instructions emulate
# them (seen: 5 s for one 1024^3 bf16 product on a 2-core VM).
CPU_MATMUL_PROBE_S = 0.2
CPU_SIDE = 1024
MIN_MATMUL_N = 128

# The Triton sweep (kernels/triton/ceiling.py sweep()) is screened before it is timed in full: only launch
# shapes within SCREEN_MARGIN of the fastest in a short screen (a tenth of a measurement, at least
# SCREEN_REPS repetitions) can set the ceiling. At a bandwidth-bound size one configuration's p90/p10
# spread is ~1% on a GPU, so one 10% behind cannot win; where the screen errs, the ceiling is too low and
# the invariant (above_ceiling) flags the rows that beat it.
SWEEP_PREFIX = "triton b"
SCREEN_MARGIN = 1.10
SCREEN_REPS = 10

Closure = Callable[[], object]
# A method builds its closure from (inputs, output buffer); or it is a string: why it cannot run here.
Builder = Callable[[Sequence[Any], Any], Closure]


# Bytes of one tensor of each case of the benchmark matrix: pattern -> dtype -> sizes
# (gpulab.bench.sizes.matrix_tensor_bytes).
MatrixBytes = Mapping[str, Mapping[str, Sequence[int]]]


def plateau_bytes(matrix: MatrixBytes, dtype: str, fallback: int) -> int:
    """The largest tensor of ``dtype`` the matrix uses (any pattern), where every pattern's plateau is
    measured; ``fallback`` (the matrix's size cap) for a dtype the matrix does not use."""
    return max((b for by_dtype in matrix.values() for b in by_dtype.get(dtype, ())), default=fallback)


def ceiling_sizes(matrix: MatrixBytes, pattern: str, dtype: str, largest: int) -> list[int]:
    """Tensor sizes one memory pattern is measured at in ``dtype``, ascending: every size the matrix uses
    for it up to ``largest``, and ``largest`` itself (the plateau). Nothing else: a size no row and no
    roofline looks up is not measured."""
    return sorted({*(int(b) for b in matrix.get(pattern, {}).get(dtype, ()) if b <= largest), int(largest)})


def _triton_reason(info: DeviceInfo) -> str:
    """Why Triton cannot be a method here ('' when it can)."""
    if not info.gpu_available:
        return f"Triton needs a GPU ({info.reason}); CPU ceilings use the torch methods"
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    try:
        from gpulab.kernels.triton import ceiling  # noqa: F401
    except Exception as exc:  # a broken Triton install is a recorded outcome, not a crash
        return f"Triton kernels failed to import: {type(exc).__name__}: {exc}"
    return ""


def pattern_methods(pattern: str, triton_reason: str, graph_reason: str = "",
                    compile_reason: str = "not a method of this measurement") -> dict[str, Builder | str]:
    """Every method of one memory pattern: a builder, or the reason it cannot run here (``graph_reason``,
    ``compile_reason``: why device graphs, torch.compile cannot; '' where they can)."""
    import torch

    methods: dict[str, Builder | str] = {}
    if pattern == "read":
        methods["torch.sum"] = lambda ins, out: (lambda: torch.sum(ins[0]))
    elif pattern == "copy":
        methods["memcpy"] = lambda ins, out: (lambda: out.copy_(ins[0]))
        methods[GRAPH_COPY] = graph_reason or (lambda ins, out: replayed(lambda: out.copy_(ins[0])))
        methods["torch.neg"] = lambda ins, out: (lambda: torch.neg(ins[0], out=out))
    else:
        methods["torch.add"] = lambda ins, out: (lambda: torch.add(ins[0], ins[1], out=out))
    if pattern in INDUCTOR_OPS:
        methods[INDUCTOR] = compile_reason or _inductor_method(pattern)
    from_sweep = _triton_methods(pattern) if not triton_reason else {}
    methods.update(from_sweep or {"triton": triton_reason})
    return methods


# Inductor's kernel for the pattern's op, compiled for each size and dtype as the torch_compile rows' are: its launch
# shape and code are its own (on an H100 its add ran 0.6% faster than any swept shape; docs/decisions.md).
INDUCTOR = "torch.compile"


def _neg(x: Any) -> Any:
    return -x


def _add(x: Any, y: Any) -> Any:
    return x + y


INDUCTOR_OPS = {"copy": _neg, "add": _add}


def _inductor_reason(info: DeviceInfo, triton_reason: str) -> str:
    """Why Inductor's kernels cannot be a method here ('' where they can): GPUs only, through Triton."""
    if not info.gpu_available:
        return ("torch.compile is a GPU ceiling method: on a CPU every size and dtype would be a C++ compile of "
                "seconds")
    return f"torch.compile's GPU code generator needs Triton: {triton_reason}" if triton_reason else ""


def _inductor_method(pattern: str) -> Builder:
    from gpulab.core.compiled import static_compile

    compiled = static_compile(INDUCTOR_OPS[pattern])
    return lambda ins, out: (lambda: compiled(*ins))


GRAPH_COPY = "memcpy (graph replay)"


def replayed(call: Closure) -> Closure:
    """``call`` captured once in a CUDA/HIP graph; the closure replays it (one graph launch, no per-op host work:
    how the LLM engines launch their steps)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warmed outside the capture, as PyTorch's graph notes require
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def _triton_methods(pattern: str) -> dict[str, Builder]:
    from gpulab.kernels.triton import ceiling

    def build(block: int, warps: int) -> Builder:
        if pattern == "read":
            def read(ins: Sequence[Any], out: Any) -> Closure:
                import torch

                partial = torch.empty(-(-ins[0].numel() // block), device=ins[0].device, dtype=torch.float32)
                return lambda: ceiling.read(ins[0], partial, block, warps)

            return read
        if pattern == "copy":
            return lambda ins, out: (lambda: ceiling.copy(ins[0], out, block, warps))
        return lambda ins, out: (lambda: ceiling.add(ins[0], ins[1], out, block, warps))

    return {f"triton b{block} w{warps}": build(block, warps) for block, warps in ceiling.sweep()}


def with_state(info: DeviceInfo, run: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of one group of measurements, each with the GPU's state read before and after the group."""
    before = gpu_state(info.backend)
    rows = run()
    after = gpu_state(info.backend)
    state = {"gpu_before": state_text(before), "gpu_after": state_text(after), "throttled": throttled(before, after)}
    return [{**row, **state} if row["status"] != "skipped" else row for row in rows]


def timed_row(closures: Sequence[Closure], timing: TimingSettings, info: DeviceInfo,
              footprint_bytes: int = 0) -> dict[str, Any]:
    """Timing columns of one method; its own tensors (``footprint_bytes``) size the flush (timing.flush_bytes)."""
    return {"status": "ok", "reason": "", **measure(list(closures), timing, info, footprint_bytes).as_row()}


def pattern_sets(pattern: str, dtype: str, tensor_bytes: int, timing: TimingSettings,
                 info: DeviceInfo) -> list[tuple[list[Any], Any]]:
    """The (inputs, output buffer) sets a method of the pattern rotates over at one size and dtype."""
    import torch

    numel = tensor_bytes // ITEMSIZE[dtype]
    dev, tdtype = info.torch_device, torch_dtype(dtype)
    n_sets = rotation_sets(timing, info, (PATTERN_INPUTS[pattern] + 1) * tensor_bytes)
    return [([torch.randn(numel, device=dev).to(tdtype) for _ in range(PATTERN_INPUTS[pattern])],
             torch.empty(numel, device=dev, dtype=tdtype)) for _ in range(n_sets)]


def reference_closures(pattern: str, dtype: str, tensor_bytes: int, timing: TimingSettings,
                       info: DeviceInfo) -> tuple[str, list[Closure]]:
    """The pattern's reference method (REFERENCE_METHODS) over its input sets, for a bench cell to time beside
    a case of that size and dtype (``timing.reference``)."""
    name = REFERENCE_METHODS[pattern]
    builder = pattern_methods(pattern, "not a reference")[name]
    assert not isinstance(builder, str)
    return name, [builder(ins, out) for ins, out in pattern_sets(pattern, dtype, tensor_bytes, timing, info)]


def measure_pattern(pattern: str, dtype: str, tensor_bytes: int, methods: Mapping[str, Builder | str],
                    timing: TimingSettings, info: DeviceInfo) -> list[dict[str, Any]]:
    """All methods of one pattern at one size and dtype: one row each (the GPU state: see with_state)."""
    moved = PATTERN_TRANSFERS[pattern] * tensor_bytes
    base = {"kind": pattern, "dtype": dtype, "size": str(tensor_bytes), "tensor_bytes": tensor_bytes,
            "bytes_moved": moved}
    sets = pattern_sets(pattern, dtype, tensor_bytes, timing, info)

    def timed(name: str, builder: Builder, settings: TimingSettings) -> dict[str, Any]:
        try:
            row = timed_row([builder(ins, out) for ins, out in sets], settings, info,
                            (PATTERN_INPUTS[pattern] + 1) * tensor_bytes)
        except Exception as exc:  # one method failing (e.g. a Triton config that does not compile) is recorded
            log.warning("%s %s %s %s: %s", pattern, dtype, tensor_bytes, name, exc)
            row = {"status": "oom" if "out of memory" in str(exc).lower() else "failed",
                   "reason": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
        if row["status"] == "ok":
            row["gbps"] = ceiling_rate(moved, row)
        return row

    behind = screen_sweep(methods, timing, timed)
    rows = []
    for name, builder in methods.items():
        if isinstance(builder, str):
            row = {"status": "skipped", "reason": builder}
        else:
            row = behind.get(name) or timed(name, builder, timing)
        rows.append({**base, "method": name, **row})
    return rows


def screen_settings(timing: TimingSettings) -> TimingSettings:
    """A tenth of a full measurement (at least SCREEN_REPS repetitions), to rank the sweep's launch shapes."""
    wall = timing.max_wall_s if timing.max_wall_s == "auto" else float(timing.max_wall_s) / 10
    return replace(timing, min_time_s=timing.min_time_s / 10, max_wall_s=wall,
                   min_reps=SCREEN_REPS, max_reps=max(SCREEN_REPS, timing.max_reps // 10))


def screen_sweep(methods: Mapping[str, Builder | str], timing: TimingSettings,
                 timed: Callable[[str, Builder, TimingSettings], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Triton sweep's configurations that cannot set the ceiling, with their screen rows: each is timed
    briefly, and one whose screened median is more than SCREEN_MARGIN behind the fastest screened one is not
    timed in full (its row keeps the screen's timing and says so). The others are timed in full by the caller."""
    sweep = {n: b for n, b in methods.items() if n.startswith(SWEEP_PREFIX) and not isinstance(b, str)}
    if len(sweep) < 2:
        return {}
    screened = {name: timed(name, builder, screen_settings(timing)) for name, builder in sweep.items()}
    ok = {name: row["median_ms"] for name, row in screened.items() if row["status"] == "ok"}
    if not ok:
        return screened
    best = min(ok, key=ok.__getitem__)
    return {name: {**row, "reason": f"screened out: {ok[name] / ok[best]:.3g}x the time of {best} in "
                   f"{row['reps']} screening repetitions; not timed in full"} if name in ok else row
            for name, row in screened.items() if name not in ok or ok[name] > SCREEN_MARGIN * ok[best]}


def fit_cpu_matmul(n: int, dtype: Any, probe_s: float = CPU_MATMUL_PROBE_S) -> int:
    """Largest side <= n (halving) whose single CPU product takes at most ``probe_s``."""
    import time

    import torch

    while n > MIN_MATMUL_N:
        a = torch.randn(n, n).to(dtype)
        start = time.perf_counter()
        a @ a
        if time.perf_counter() - start <= probe_s:
            break
        n //= 2
    return n


Gemm = tuple[int, int, int]


def matmul_shapes(gemms: Sequence[Gemm], info: DeviceInfo, dtype: Any, square: int | None = None,
                  squares: bool = True) -> list[Gemm]:
    """(M, N, K) of the matmul ceiling: squares (``square``, else 4096 and 8192 on a GPU, the largest fast
    one up to 1024 on CPU; none without ``squares``) and a workload's own GEMMs (``gemms``, e.g. the MLP's from
    :func:`gpulab.mlp.model.gemm_shapes`)."""
    if not squares:
        sides: tuple[int, ...] = ()
    elif square is not None:
        sides = (square,)
    else:
        sides = SQUARE_SIDES if info.gpu_available else (fit_cpu_matmul(CPU_SIDE, dtype),)
    shapes = [(n, n, n) for n in sides] + [tuple(g) for g in gemms]
    return list(dict.fromkeys(shapes))


def matmul_modes(dtypes: Sequence[str], info: DeviceInfo) -> list[str]:
    """The matmul modes a ceiling is measured in: the dtypes, and TF32, a CUDA-only mode (ROCm has none), so tf32
    variants have a ceiling."""
    return [*dtypes, "tf32"] if info.backend == "cuda" and "fp32" in dtypes else list(dtypes)


def measure_matmul(modes: Sequence[str], gemms: Sequence[Gemm], timing: TimingSettings,
                   info: DeviceInfo, square: int | None = None, squares: bool = True) -> list[dict[str, Any]]:
    import torch

    rows = []
    for mode in modes:
        dtype = torch_dtype("fp32" if mode == "tf32" else mode)
        for m, n, k in matmul_shapes(gemms, info, dtype, square, squares):
            a = torch.randn(m, k, device=info.torch_device, dtype=dtype)
            b = torch.randn(k, n, device=info.torch_device, dtype=dtype)
            previous = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            try:
                footprint = (m * k + k * n + m * n) * a.element_size()
                row = with_state(info, lambda a=a, b=b, f=footprint: [timed_row([lambda: a @ b], timing, info, f)])[0]
            finally:
                torch.backends.cuda.matmul.allow_tf32 = previous
            rows.append({"kind": "matmul", "dtype": mode, "size": f"{m}x{n}x{k}", "method": "torch.matmul", **row,
                         "tflops": ceiling_rate(2 * m * n * k, row, 1e12)})
            del a, b
    return rows


def mark_best(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``best`` on the fastest ok method of each (kind, dtype, size); matmul: over all its shapes per dtype."""
    if not rows:
        return []
    df = pd.DataFrame(rows)
    gbps = df["gbps"] if "gbps" in df else pd.Series(math.nan, index=df.index)
    value = gbps.where(df["kind"] != "matmul", df["tflops"]) if "tflops" in df else gbps
    group = df["kind"] + "|" + df["dtype"] + "|" + df["size"].where(df["kind"] != "matmul", "")
    ok = value.where(df["status"] == "ok")
    winners = set(ok.groupby(group).idxmax().dropna().astype(int))
    return [{**row, "best": i in winners} for i, row in enumerate(rows)]


def measure_ceilings(
    config: Mapping[str, Any],
    timing: TimingSettings,
    *,
    target: str,
    fingerprint: str,
    matrix: MatrixBytes | None = None,
    max_tensor_bytes: int | None = None,
    device: DeviceInfo | None = None,
) -> list[dict[str, Any]]:
    """Every ceiling row of one target (the rule bench_ceilings): memory patterns at the sizes ``matrix``
    uses and at the plateau size (``ceilings.copy_mib`` MiB, else the matrix's largest tensor of the dtype,
    else ``max_tensor_bytes``), matmul over its shapes."""
    info = device or detect()
    timing = timing.for_device(info)  # once for every pattern and size: the screen scales the resolved values
    matrix = matrix or {}
    dtypes = list(config.get("dtypes", ["fp32", "fp16", "bf16"]))
    copy_mib = config.get("copy_mib", "auto")
    fallback = max_tensor_bytes or max_tensor_bytes_of(info)
    triton_reason = _triton_reason(info)
    graph_reason = "" if info.gpu_available else f"device graphs need a GPU ({info.reason})"
    rows: list[dict[str, Any]] = []
    for pattern in MEMORY_PATTERNS:
        methods = pattern_methods(pattern, triton_reason, graph_reason, _inductor_reason(info, triton_reason))
        for dtype in dtypes:
            largest = plateau_bytes(matrix, dtype, fallback) if copy_mib == "auto" else int(copy_mib) * MiB
            for size in ceiling_sizes(matrix, pattern, dtype, largest):
                rows += with_state(info, partial(measure_pattern, pattern, dtype, size, methods, timing, info))
                log.info("%s %s %s: best %.4g GB/s", pattern, dtype, size,
                         max((r.get("gbps") or 0.0) for r in rows[-len(methods):]))
    square = config.get("matmul_n", "auto")
    rows += measure_matmul(matmul_modes(dtypes, info), (), timing, info, None if square == "auto" else int(square))
    return [{"target": target, "fingerprint": fingerprint, **row} for row in mark_best(rows)]


def regime(ceiling_gbps: float, plateau_gbps: float) -> str:
    """``latency`` where the ceiling at a size is below LATENCY_FRACTION of the pattern's plateau (the best
    method cannot approach bandwidth there), ``bandwidth`` otherwise, ``""`` without a ceiling."""
    if math.isnan(ceiling_gbps):
        return ""
    if not math.isnan(plateau_gbps) and ceiling_gbps < LATENCY_FRACTION * plateau_gbps:
        return "latency"
    return "bandwidth"


@dataclass(frozen=True)
class Hit:
    """The ceiling a row is placed against: its rate, the size it was measured at, who won, its spread,
    and the pattern's plateau (its ceiling at the largest measured size, same dtype)."""

    gbps: float
    tensor_bytes: float
    method: str
    spread: float  # p90 / p10 of the ceiling's repetition times
    plateau: float = math.nan

    @property
    def regime(self) -> str:
        return regime(self.gbps, self.plateau)


MISS = Hit(math.nan, math.nan, "", math.nan)


@dataclass(frozen=True)
class Ceilings:
    """Lookup of one target's measured ceilings (read from the table at ``CEILINGS.path``)."""

    table: pd.DataFrame

    @classmethod
    def load(cls, path: str | Path) -> Ceilings:
        return cls(CEILINGS.read(path))

    def best(self, kind: str) -> pd.DataFrame:
        t = self.table
        return t[(t["kind"] == kind) & (t["status"] == "ok") & (t["best"].astype(str).str.lower() == "true")]

    @cached_property
    def _found(self) -> dict[tuple[str, str], pd.DataFrame]:
        """``_of``'s answers so far: the report looks a ceiling up for each of hundreds of rows."""
        return {}

    def _of(self, pattern: str, dtype: str) -> pd.DataFrame:
        """The pattern's ceilings in ``dtype`` (every dtype's when this one was not measured)."""
        if (pattern, dtype) not in self._found:
            rows = self.best(pattern)
            same = rows[rows["dtype"] == dtype]
            rows = same if not same.empty else rows
            self._found[pattern, dtype] = rows.assign(
                _bytes=pd.to_numeric(rows["tensor_bytes"], errors="coerce").astype(float))
        return self._found[pattern, dtype]

    def lookup(self, pattern: str, dtype: str, tensor_bytes: float) -> Hit:
        """The pattern's ceiling at ``tensor_bytes`` in ``dtype``: exact where that size was measured (every
        size of the benchmark matrix is), else at the nearest measured size (in log size)."""
        rows = self._of(pattern, dtype)
        if rows.empty:
            return MISS
        distance = (np.log(rows["_bytes"]) - math.log(max(float(tensor_bytes), 1.0))).abs()
        # Ties between dtypes at one size: the faster, so the fallback never understates the ceiling.
        hit = rows.assign(_d=distance.round(9)).sort_values(["_d", "gbps"], ascending=[True, False]).iloc[0]
        return Hit(float(hit["gbps"]), float(hit["tensor_bytes"]), str(hit["method"]),
                   float(hit["p90_ms"]) / float(hit["p10_ms"]), self.largest(pattern, dtype))

    def largest(self, pattern: str, dtype: str) -> float:
        """The pattern's plateau: its ceiling at the largest measured size (GB/s), e.g. for a decode roofline."""
        rows = self._of(pattern, dtype)
        if rows.empty:
            return math.nan
        return float(rows.sort_values(["_bytes", "gbps"], ascending=[False, False])["gbps"].iloc[0])

    def copy_gbps(self, dtype: str = "fp32") -> float:
        return self.largest("copy", dtype)

    def read_gbps(self, dtype: str = "fp32") -> float:
        return self.largest("read", dtype)

    def regimes(self) -> pd.Series:
        """Per row of the table: the regime of its memory pattern, dtype and size (empty for matmul and
        rows that are not ok)."""
        t = self.table
        out = pd.Series("", index=t.index, dtype=object)
        memory = t[t["kind"].isin(list(PATTERN_TRANSFERS)) & (t["status"] == "ok")]
        # One lookup per measured size, not per method's row: the report asks this of the whole table.
        for (kind, dtype, tensor_bytes), group in memory.groupby(["kind", "dtype", "tensor_bytes"], sort=False):
            out[group.index] = self.lookup(kind, dtype, tensor_bytes).regime
        return out

    def matmul_tflops(self, dtype: str) -> float:
        return self.matmul(dtype).gbps

    def matmul(self, dtype: str) -> Hit:
        """The matmul ceiling of ``dtype`` (TFLOP/s in ``gbps``): the fastest best row over its shapes and methods."""
        rows = self.best("matmul")
        rows = rows[rows["dtype"] == dtype]
        if rows.empty:
            return MISS
        top = rows.loc[rows["tflops"].astype(float).idxmax()]
        return Hit(float(top["tflops"]), math.nan, f"{top['method']} {top['size']}",
                   float(top["p90_ms"]) / float(top["p10_ms"]))


def with_regimes(table: pd.DataFrame) -> pd.DataFrame:
    """The ceilings table with each memory row's ``regime`` (per target: ``latency`` where the best method at that
    size is below half the pattern's plateau); a table from before ``best`` existed as it is."""
    if table.empty or "best" not in table.columns:
        return table
    parts = [Ceilings(group).regimes() for _, group in table.groupby("target", sort=False)]
    return table.assign(regime=pd.concat(parts))


def pct_of(value: float, ceiling: float) -> float:
    """Percentage of a ceiling; NaN when either is unknown. The ratio first: a row that set its own ceiling is
    then exactly 100 (100 * x / x can round to 100.00000000000001, a figure above its ceiling)."""
    if not ceiling or math.isnan(ceiling) or value is None or math.isnan(value):
        return math.nan
    return 100.0 * (value / ceiling)


def above_ceiling(gbps: float, ceiling: Hit, row_spread: float) -> bool:
    """The invariant: a row may exceed its ceiling only by the spread of both (p90/p10 of each)."""
    if math.isnan(ceiling.gbps) or math.isnan(gbps):
        return False
    allowed = ceiling.gbps * (ceiling.spread if ceiling.spread == ceiling.spread else 1.0) * row_spread
    return bool(gbps > allowed)


# How far a benchmarked row may beat every dedicated method and still be taken as a faster kernel of the same
# traffic rather than a wrong byte count or timer: an op's byte count off by one tensor is off by a third or a half.
RAISE_LIMIT = 1.05


SHARED_KEYS = ["pattern", "dtype", "tensor_bytes"]


def share_ceilings(rows: pd.DataFrame) -> pd.DataFrame:
    """One ceiling per (pattern, dtype, tensor size), shared by every row of every op's table: ``rows`` are all the
    benchmark cells of a target together. The dedicated ceiling of a size is the fastest of its methods: those of
    the ceilings job and every reference timed beside a case of that size (``dedicated_ceiling_gbps``, the highest
    any row carries). Where a bandwidth-bound ok row beat it by at most RAISE_LIMIT, or by more but within the
    spread of both (``above_ceiling`` false: on the shared 2-core CPU an add measured 24% above torch.add at p90/p10
    spreads of 1.3 each, one noisy median against another), the fastest such row is the ceiling: it moves exactly
    the pattern's bytes, so it is as much a measured limit as a copy is. This is the one place a ceiling is
    raised; ``ceiling_method`` names the row that raised it and ``dedicated_ceiling_gbps`` keeps the methods'
    figure. A row beyond both RAISE_LIMIT and the spread raises nothing: it stays above 100% and red, as a byte
    count (or a timing) not to be trusted."""
    df = rows.copy()
    # Cells an ok row gets whatever they held: a latency row's verdict is empty, a ceiling method text.
    for column in ("above_ceiling", "ceiling_method", "regime", "ceiling_spread", "ceiling_bytes"):
        df[column] = df[column].astype(object) if column in df else None
    ok = (df["status"] == "ok") & df["gbps"].notna() & df["dedicated_ceiling_gbps"].notna()
    for _, group in df[ok].groupby(SHARED_KEYS):
        dedicated = group.loc[group["dedicated_ceiling_gbps"].idxmax()]
        ceiling = Hit(float(dedicated["dedicated_ceiling_gbps"]), float(dedicated["tensor_bytes"]),
                      str(dedicated["ceiling_method"]), _spread(dedicated))
        regime = "bandwidth" if group["regime"].eq("bandwidth").any() else "latency"
        spreads = group["p90_ms"] / group["p10_ms"]
        plausible = [gbps <= ceiling.gbps * RAISE_LIMIT or not above_ceiling(gbps, ceiling, spread)
                     for gbps, spread in zip(group["gbps"], spreads, strict=True)]
        judged = group[plausible]
        if regime == "bandwidth" and not judged.empty and judged["gbps"].max() > ceiling.gbps:
            fastest = judged.loc[judged["gbps"].idxmax()]
            ceiling = Hit(float(fastest["gbps"]), float(fastest["tensor_bytes"]),
                          f"{fastest['op']} {fastest['impl']} (fastest row; above every method)",
                          float(fastest["p90_ms"]) / float(fastest["p10_ms"]))
        for index, spread, trusted in zip(group.index, spreads, plausible, strict=True):
            shared = _placed(float(group.at[index, "gbps"]), ceiling, regime, spread)
            if regime == "bandwidth" and not trusted:
                shared["above_ceiling"] = True  # beyond the methods by more than RAISE_LIMIT and both spreads
            for column, value in {**shared, "dedicated_ceiling_gbps": dedicated["dedicated_ceiling_gbps"]}.items():
                df.at[index, column] = value
    return df


def _spread(row: pd.Series) -> float:
    spread = pd.to_numeric(pd.Series([row.get("ceiling_spread")]), errors="coerce").iloc[0]
    return float(spread) if pd.notna(spread) else 1.0


def _placed(gbps: float, ceiling: Hit, regime: str, row_spread: float) -> dict[str, Any]:
    latency = regime == "latency"
    return {"ceiling_gbps": ceiling.gbps, "ceiling_bytes": int(ceiling.tensor_bytes), "ceiling_method": ceiling.method,
            "ceiling_spread": ceiling.spread, "regime": regime,
            "pct_of_ceiling": math.nan if latency else pct_of(gbps, ceiling.gbps),
            "above_ceiling": None if latency else above_ceiling(gbps, ceiling, row_spread)}


def raised_rows(rows: pd.DataFrame) -> int:
    """Rows placed against a benchmarked row rather than a ceiling method (share_ceilings)."""
    return int(rows["ceiling_method"].astype(str).str.endswith("(fastest row; above every method)").sum())


def placement(gbps: float, ceiling: Hit, row_spread: float) -> dict[str, Any]:
    """A benchmark row's ceiling columns. A latency-bound row keeps its ceiling but gets no percentage and
    is not judged by the invariant (``above_ceiling`` empty): bandwidth is not what sets its time."""
    latency = ceiling.regime == "latency"
    return {
        "ceiling_gbps": ceiling.gbps,
        "dedicated_ceiling_gbps": ceiling.gbps,
        "ceiling_bytes": None if math.isnan(ceiling.tensor_bytes) else int(ceiling.tensor_bytes),
        "ceiling_method": ceiling.method,
        "ceiling_spread": ceiling.spread,
        "regime": ceiling.regime,
        "pct_of_ceiling": math.nan if latency else pct_of(gbps, ceiling.gbps),
        "above_ceiling": None if latency else above_ceiling(gbps, ceiling, row_spread),
    }
