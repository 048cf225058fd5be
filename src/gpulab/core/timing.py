"""The one timing function of the project (docs/methodology/timing.md).

Every measured figure goes through :func:`measure`: an untimed first call (``first_call_ms``), warm-up calls and
pilot block, then blocks of repetitions (device events on a GPU, ``perf_counter`` on a CPU) until the median is
known to a target precision (:func:`judge`: ``rel_ci``, ``stop_reason``), between a floor and a cap; before each
repetition a buffer of twice the last-level cache is read (``flush_bytes``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gpulab.core import energy
from gpulab.core.device import DeviceInfo, detect, last_level_cache_bytes, synchronize

# The flush reads twice the last-level cache the device reports (Triton's do_bench clears 256 MB, NVBench the L2);
# a case whose own tensors exceed NO_FLUSH_MULTIPLE times that cache cannot find them in it and is not flushed.
FLUSH_CACHE_MULTIPLE = 2
NO_FLUSH_MULTIPLE = 4
# Where the device reports no cache size: more than MI300X's 256 MiB Infinity Cache on a GPU.
GPU_FLUSH_BYTES = 512 * 2**20
CPU_FLUSH_BYTES = 64 * 2**20
# The stopping rule (judge): at least MIN_BLOCKS blocks and min_reps repetitions; a 95% interval of the median.
MIN_BLOCKS = 2
CI_Z = 1.96
# "noise settled": from NOISE_MIN_BLOCKS blocks on, the spread of the repetitions moved by at most this share over
# the last NOISE_WINDOW blocks, and the cap's repetitions would not bring rel_ci to the target.
NOISE_MIN_BLOCKS = 4
NOISE_WINDOW = 3
NOISE_SETTLED_CHANGE = 0.10
# A call shorter than this (``latency_call_ms: auto``) is latency-bound: launch and first access set its time, so
# its target is rel_ci_latency. About twice a GPU's launch latency; a CPU op's dispatch costs more.
GPU_LATENCY_CALL_MS = 0.02
CPU_LATENCY_CALL_MS = 0.1
# The stability rule: a row breaking any of these is reported as not stable.
MAX_MEAN_OVER_MEDIAN = 1.10
MAX_CV = 0.10
MIN_STABLE_REPS = 5
# Wall-time cap of one measurement (``max_wall_s: auto``): on a CPU the flush before each repetition, not a small op,
# sets the cost, and the run-vs-run interval comes from the spread between blocks, not their length.
GPU_MAX_WALL_S = 3.0
CPU_MAX_WALL_S = 0.5
# Measured time of a measurement's most blocks, which sizes each (``min_time_s: auto``): a GPU's repetitions
# agree closely, a shared CPU drifts for seconds (evidence: docs/decisions.md).
GPU_MIN_TIME_S = 0.1
CPU_MIN_TIME_S = 0.25
# Least wall time the interleaved blocks of a benchmark cell span (``min_span_s: auto``): a shared CPU's speed
# shifts for seconds, and the span spreads each case over those states (A/A calibration: docs/decisions.md).
CPU_MIN_SPAN_S = 5.0
GPU_MIN_SPAN_S = 1.0
# Whether a bench cell times its pattern's reference method beside each case, a block of each in turn
# (``reference: auto``): on a CPU, whose shared state moves a whole cell by 30-60% for seconds, the reference
# moves with it, so the run-vs-run comparison judges each case's time relative to it. Off on a GPU: its blocks
# agree to about 1% (no drift to cancel), and each reference would add to a run already over its time goal.
CPU_REFERENCE = True
GPU_REFERENCE = False
# Largest allocation held during a block to move the op's outputs (several pages, so both the offset
# within a page and the cache sets an output maps to change).
LAYOUT_SHIM_BYTES = 64 * 2**10
# Most calls of one block of a measurement's energy block (a device event pair each), and most such blocks: the
# energy block repeats them until it spans energy_span_s.
MAX_ENERGY_CALLS = 10_000
MAX_ENERGY_BLOCKS = 20
# An energy block runs the device flat out for seconds and its power limiter holds the clocks down for a while after:
# the next measurement of the process starts this long after the block's end (without it, the first-token calls
# timed right after the prefill's block ran up to 2 ms slower, recovering over their three calls).
SETTLE_AFTER_ENERGY_BLOCK_S = 1.0
BLOCK_SEPARATOR = "|"


@dataclass(frozen=True)
class TimingSettings:
    min_time_s: float | str = "auto"
    min_reps: int = 10
    max_reps: int = 1000
    max_wall_s: float | str = "auto"
    warmup_reps: int = 3
    flush_cache: bool = True
    blocks: int = 8
    min_span_s: float | str = "auto"
    reference: bool | str = "auto"
    # The stopping rule's targets (rel_ci: 95% half-width of the median over the median) and the call time under
    # which a measurement is latency-bound.
    rel_ci_bandwidth: float = 0.005
    rel_ci_latency: float = 0.02
    latency_call_ms: float | str = "auto"
    # Where the timed blocks span less than this and the device has an energy counter: a block of further calls
    # after them, spanning at least this long, is read for the energy alone (its times are not kept). 0: none.
    energy_span_s: float = 0.0

    @classmethod
    def from_config(cls, timing_config: Mapping[str, Any] | None) -> TimingSettings:
        known = {k: v for k, v in (timing_config or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def for_device(self, info: DeviceInfo) -> TimingSettings:
        """These settings with ``auto`` values resolved for the device that measures."""
        gpu = info.gpu_available
        resolved = self
        if self.min_time_s == "auto":
            resolved = replace(resolved, min_time_s=GPU_MIN_TIME_S if gpu else CPU_MIN_TIME_S)
        if self.max_wall_s == "auto":
            resolved = replace(resolved, max_wall_s=GPU_MAX_WALL_S if gpu else CPU_MAX_WALL_S)
        if self.min_span_s == "auto":
            resolved = replace(resolved, min_span_s=GPU_MIN_SPAN_S if gpu else CPU_MIN_SPAN_S)
        if self.reference == "auto":
            resolved = replace(resolved, reference=GPU_REFERENCE if gpu else CPU_REFERENCE)
        if self.latency_call_ms == "auto":
            resolved = replace(resolved, latency_call_ms=GPU_LATENCY_CALL_MS if gpu else CPU_LATENCY_CALL_MS)
        return resolved

    def target(self, call_ms: float) -> float:
        """The rel_ci a measurement stops at: rel_ci_latency for a call under latency_call_ms, else rel_ci_bandwidth."""
        return self.rel_ci_latency if call_ms < float(self.latency_call_ms) else self.rel_ci_bandwidth


@dataclass(frozen=True)
class Timing:
    """Summary of one measurement; :meth:`as_row` gives the columns every measured CSV row carries."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    cv: float
    reps: int
    warmup_reps: int  # untimed calls before the kept repetitions (warm-up and the pilot block)
    first_call_ms: float
    timer: str  # device_event | perf_counter
    cache_policy: str  # flush | rotate:N | none
    stable: bool = False  # see is_stable; measure() always sets it
    times_ms: str = ""  # every repetition's time, blocks separated by "|" (format_blocks / parse_blocks)
    # Device energy of one call (gpulab.core.energy: the counter read around each block, the cache flushes taken off),
    # its mean power over the call's mean time, and why either is unknown (empty when known).
    energy_j: float = math.nan
    power_w: float = math.nan
    energy_reason: str = ""
    rel_ci: float = math.nan  # 95% half-width of the median over the median (median_ci)
    stop_reason: str = ""  # precision | cap | noise settled | count (judge)
    flush_bytes: int = 0  # bytes the cache flush read before each repetition (0: not flushed)

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


TIMING_COLUMNS = tuple(Timing.__dataclass_fields__)


def is_stable(mean_ms: float, median_ms: float, cv: float, reps: int) -> bool:
    """The stability rule: not stable where the mean is more than MAX_MEAN_OVER_MEDIAN of the median (a stall in
    some repetitions), the coefficient of variation exceeds MAX_CV, or under MIN_STABLE_REPS repetitions were taken."""
    if reps < MIN_STABLE_REPS or not median_ms > 0:
        return False
    return bool(mean_ms / median_ms <= MAX_MEAN_OVER_MEDIAN and cv <= MAX_CV)


def format_times(samples_ms: Sequence[float]) -> str:
    """Repetition times as compact text for a CSV cell (5 significant digits: 0.01% resolution)."""
    return " ".join(f"{t:.5g}" for t in samples_ms)


def format_blocks(blocks: Sequence[Sequence[float]]) -> str:
    """Repetition times of several blocks, in timed order, blocks separated by ``|``."""
    return f" {BLOCK_SEPARATOR} ".join(format_times(block) for block in blocks if len(block))


def parse_blocks(text: object) -> list[np.ndarray]:
    """The blocks of a ``times_ms`` cell (one block for rows recorded before blocks; none when empty)."""
    if not isinstance(text, str) or not text.strip():
        return []
    blocks = [np.array([float(t) for t in part.split()], dtype=np.float64) for part in text.split(BLOCK_SEPARATOR)]
    return [b for b in blocks if b.size]


def parse_times(text: object) -> np.ndarray:
    """Every repetition time of a ``times_ms`` cell, blocks joined (empty when the row has none)."""
    blocks = parse_blocks(text)
    return np.concatenate(blocks) if blocks else np.array([], dtype=np.float64)


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median, p10/p90, mean, min and coefficient of variation of repetition times."""
    arr = np.asarray(samples_ms, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no samples to summarize")
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {
        "median_ms": float(np.median(arr)),
        "p10_ms": float(np.percentile(arr, 10)),
        "p90_ms": float(np.percentile(arr, 90)),
        "mean_ms": mean,
        "min_ms": float(arr.min()),
        "cv": std / mean if mean > 0 else math.nan,
    }


# Most input sets rotated when the cache is not flushed.
MAX_ROTATION = 8


def rotation_sets(settings: TimingSettings, info: DeviceInfo, bytes_per_set: int) -> int:
    """Input sets to rotate over: one when the cache is flushed before each repetition, else enough that
    the rotated inputs are twice the last-level cache (so no repetition finds its inputs cached)."""
    if settings.flush_cache:
        return 1
    cache = last_level_cache_bytes(info) or 64 * 2**20
    return max(1, min(MAX_ROTATION, math.ceil(2 * cache / max(1, bytes_per_set))))


def flush_bytes(info: DeviceInfo, footprint_bytes: int = 0) -> int:
    """Bytes the cache flush reads on ``info``'s device before a case whose own tensors are ``footprint_bytes``:
    FLUSH_CACHE_MULTIPLE x the last-level cache (a fallback where none is reported; on a GPU at most a sixteenth of
    its memory), or 0 where the case's tensors exceed NO_FLUSH_MULTIPLE x that cache."""
    cache = last_level_cache_bytes(info)
    if cache and footprint_bytes > NO_FLUSH_MULTIPLE * cache:
        return 0
    if not info.gpu_available:
        return FLUSH_CACHE_MULTIPLE * cache if cache else CPU_FLUSH_BYTES
    nbytes = FLUSH_CACHE_MULTIPLE * cache if cache else GPU_FLUSH_BYTES
    return min(nbytes, info.total_memory_bytes // 16) if info.total_memory_bytes else nbytes


class CacheFlusher:
    """Reads a buffer of twice the last-level cache (before each repetition, outside the timer).

    Reading, not writing: a flush that overwrites its buffer leaves the cache full of dirty lines, and
    the timed op then pays for writing them back (on the H100, up to 50 MB extra traffic on a 64 MiB copy
    whose own traffic is 128 MiB). Read, the cache holds clean lines that are evicted for free.
    """

    def __init__(self, info: DeviceInfo, enabled: bool) -> None:
        self.buffer = None
        self.sink = None
        self.nbytes = flush_bytes(info) if enabled else 0
        if not self.nbytes:
            return
        import torch

        # float32: PyTorch's integer sum on a CPU is 50x slower than its vectorised float sum.
        self.buffer = torch.ones(self.nbytes // 4, dtype=torch.float32, device=info.torch_device)
        self.sink = torch.zeros((), dtype=torch.float32, device=info.torch_device)

    def __call__(self) -> None:
        if self.buffer is not None:
            import torch

            torch.sum(self.buffer, dim=0, out=self.sink)


class _Layout:
    """Holds a small allocation of random size for one block, so the outputs the op allocates (and the
    allocator's state) land at a different address in each block: alignment and cache-set effects then
    show up as block-to-block variance instead of as a shift of the whole run."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.rng = np.random.default_rng()  # unseeded on purpose: each run samples fresh layouts
        self.shim: object = None

    def shuffle(self) -> None:
        import torch

        self.shim = None
        nbytes = int(self.rng.integers(1, LAYOUT_SHIM_BYTES // 64 + 1)) * 64
        self.shim = torch.empty(nbytes, dtype=torch.uint8, device=self.device)


def median_ci(samples_ms: Sequence[float]) -> float:
    """The 95% half-width of the median over the median, distribution-free: half the distance between the order
    statistics of ranks n/2 -/+ 1.96 sqrt(n)/2 (the whole range for n <= 10); NaN for fewer than 2 samples."""
    x = np.sort(np.asarray(samples_ms, dtype=np.float64))
    n = x.size
    median = float(np.median(x)) if n else math.nan
    if n < 2 or not median > 0:
        return math.nan
    half = CI_Z * math.sqrt(n) / 2
    low = max(1, math.floor(n / 2 - half))
    high = min(n, math.ceil(1 + n / 2 + half))
    return float(x[high - 1] - x[low - 1]) / 2 / median


def _spread(samples_ms: Sequence[float]) -> float:
    """The repetitions' own noise: p90 - p10 over the median."""
    x = np.asarray(samples_ms, dtype=np.float64)
    return float((np.percentile(x, 90) - np.percentile(x, 10)) / np.median(x))


def judge(blocks: Sequence[Sequence[float]], target: float, *, min_reps: int, max_reps: int, max_blocks: int,
          wall_s: float, max_wall_s: float, cap_reps: int) -> tuple[float, str]:
    """(rel_ci, why to stop now, or '' to take another block) after the blocks so far. The floor: MIN_BLOCKS blocks
    and ``min_reps``; then ``precision`` once rel_ci <= ``target``; ``cap`` at ``max_blocks`` blocks, ``max_reps``
    repetitions or ``max_wall_s`` of the blocks' wall time; ``noise settled`` where the repetitions' spread stopped
    moving (NVBench's second criterion) and ``cap_reps`` repetitions would still miss the target."""
    samples = [t for block in blocks for t in block]
    rel_ci = median_ci(samples)
    if len(blocks) < MIN_BLOCKS or len(samples) < min_reps:
        return rel_ci, ""
    if rel_ci <= target:
        return rel_ci, "precision"
    if len(blocks) >= max_blocks or len(samples) >= max_reps or wall_s >= max_wall_s:
        return rel_ci, "cap"
    if len(blocks) >= NOISE_MIN_BLOCKS:
        history = [_spread([t for block in blocks[:k] for t in block]) for k in range(len(blocks) - NOISE_WINDOW + 1,
                                                                                        len(blocks) + 1)]
        settled = max(history) <= (1 + NOISE_SETTLED_CHANGE) * min(history)
        if settled and rel_ci * math.sqrt(len(samples) / max(cap_reps, len(samples))) > target:
            return rel_ci, "noise settled"
    return rel_ci, ""


def _block_plan(settings: TimingSettings, pilot_ms: Sequence[float], pilot_wall_s: float) -> list[int]:
    """The most blocks a measurement takes (``blocks``), each sized from the pilot block: ``min_time_s`` over
    ``blocks`` of measured time, within ``max_reps`` and ``max_wall_s`` over ``blocks``; at least ``min_reps`` over
    ``blocks`` repetitions, so the floor is reached within the blocks."""
    per_rep_ms = max(float(np.median(pilot_ms)), 1e-4)
    # For tiny ops the cache flush, not the op, dominates the loop (a 64 MiB CPU flush costs ~10 ms):
    # the wall-time cap, not the measured time, then bounds the blocks.
    per_rep_wall = max(pilot_wall_s / len(pilot_ms), 1e-9)
    size = math.ceil(settings.min_time_s * 1e3 / settings.blocks / per_rep_ms)
    size = min(size, settings.max_reps // settings.blocks,
               math.floor(settings.max_wall_s / per_rep_wall / settings.blocks))
    return [max(size, math.ceil(settings.min_reps / settings.blocks), 1)] * settings.blocks


def _split(total: int, blocks: int) -> list[int]:
    """``total`` repetitions in at most ``blocks`` blocks of near-equal size."""
    sizes = [len(part) for part in np.array_split(np.arange(total), blocks)]
    return [n for n in sizes if n > 0]


class Measurement:
    """One measurement taken block by block, so several can be interleaved (the bench runner takes a cell's
    cases in turn).

    Construction does the untimed first call, the warm-up and the pilot block that sizes the blocks;
    :meth:`step` takes the next block and judges whether to stop (``done``); :meth:`sustain_energy` runs the energy
    block where one is due; :meth:`timing` summarises the kept blocks. ``flusher`` may be shared between
    measurements that run together (one cache-sized buffer, not one each); ``interleaved`` opens each block with an
    untimed call, as other closures ran in between. ``footprint_bytes``: the case's own tensors (no flush where they
    exceed NO_FLUSH_MULTIPLE x the cache); ``energy_note``: the counter is not read, the row says this instead.
    """

    def __init__(self, fn: Callable[[], object] | Sequence[Callable[[], object]], settings: TimingSettings,
                 info: DeviceInfo, flusher: CacheFlusher | None = None, interleaved: bool = False,
                 footprint_bytes: int = 0, energy_note: str = "") -> None:
        self.fns = list(fn) if isinstance(fn, Sequence) else [fn]
        if not self.fns:
            raise ValueError("measure() needs at least one closure")
        self.settings, self.info, self.energy_note = settings.for_device(info), info, energy_note
        _DEVICE_REST.settle()
        self.first_call_ms = _warm_up(self.fns, self.settings, info)
        flush = self.settings.flush_cache and flush_bytes(info, footprint_bytes) > 0
        self.timer = _BlockTimer(self.fns, info, (flusher or CacheFlusher(info, True)) if flush
                                 else CacheFlusher(info, False), interleaved)
        if energy_note:
            self.timer.meter.problem = energy_note  # never read: the row says where its energy was measured
        # A pilot block sizes the blocks and is not kept: the first repetitions after the layout moves pay
        # first-touch costs. A fixed count (min_reps = max_reps: the LLM figures) has nothing to size or judge.
        self.pilot: list[float] = []
        self.fixed = self.settings.min_reps >= self.settings.max_reps
        if self.fixed:
            self.plan = _split(self.settings.max_reps, self.settings.blocks)
        else:
            wall = time.perf_counter()
            self.pilot = self.timer.block(max(1, math.ceil(self.settings.min_reps / self.settings.blocks)))
            self.plan = _block_plan(self.settings, self.pilot, time.perf_counter() - wall)
        self.blocks: list[list[float]] = []
        self.wall_s = 0.0  # wall time of this measurement's own blocks (not of the cases interleaved with it)
        self.rel_ci, self.stop_reason = math.nan, ""
        self.sustained: tuple[energy.Meter, int, int] | None = None  # the energy block's counter, calls and flushes

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    @property
    def last(self) -> tuple[int, object]:
        """(closure index, return value) of the last timed call, so the caller can check what was timed."""
        return self.timer.last

    def pair_with(self, other: Measurement) -> None:
        """Take this measurement's repetitions in as many blocks as ``other`` may take, so it can time one block
        beside each of the other's (a reference paired block by block with a case; the case decides when to stop)."""
        blocks = len(other.plan)
        self.plan = _split(max(sum(self.plan), blocks), blocks)

    def step(self) -> None:
        """Time the next block and judge whether to stop; after the first, the blocks' span is known well enough to
        tell whether the energy counter can give a figure (the pilot's few repetitions are dominated by per-block
        costs)."""
        reps = self.plan[min(len(self.blocks), len(self.plan) - 1)]
        if not self.fixed:  # the last block stops at max_reps
            reps = max(1, min(reps, self.settings.max_reps - sum(len(block) for block in self.blocks)))
        start = time.perf_counter()
        self.blocks.append(self.timer.block(reps))
        self.wall_s += time.perf_counter() - start
        if len(self.blocks) == 1:
            self.timer.meter.expect(self.wall_s / self.plan[0] * sum(self.plan))
        samples = [t for block in self.blocks for t in block]
        if self.fixed:
            self.rel_ci = median_ci(samples)
            self.stop_reason = "count" if len(self.blocks) >= len(self.plan) else ""
            return
        s = self.settings
        self.rel_ci, self.stop_reason = judge(
            self.blocks, s.target(float(np.median(self.pilot or samples))), min_reps=s.min_reps, max_reps=s.max_reps,
            max_blocks=len(self.plan), wall_s=self.wall_s, max_wall_s=float(s.max_wall_s), cap_reps=sum(self.plan))

    def sustain_energy(self) -> None:
        """Where energy_span_s asks for it, the counter works and the timed blocks spanned less: a block of further
        calls, repeated until it spans energy_span_s, read for the energy alone (after every block of the
        measurement and of those interleaved with it: the device's power limiter slows what follows it)."""
        meter = self.timer.meter
        if not self.settings.energy_span_s or self.energy_note or meter.source.reason:
            return
        if meter.span_s >= self.settings.energy_span_s and not meter.problem:
            return
        # sized by a call's median time: back to back a call takes at least that
        call_s = float(np.median([t for block in self.blocks for t in block])) / 1e3
        calls = min(math.ceil(self.settings.energy_span_s / max(call_s, 1e-6)), MAX_ENERGY_CALLS)
        self.sustained = self.timer.energy_block(calls, self.settings.energy_span_s)

    def timing(self) -> Timing:
        samples = [t for block in self.blocks for t in block]
        stats = summarize(samples)
        found = (energy.Energy(reason=self.energy_note) if self.energy_note
                 else self.timer.energy(stats["mean_ms"], self.sustained))
        return Timing(
            **stats,
            reps=len(samples),
            # every untimed call: warm-up, the pilot block (and the calls opening each interleaved block)
            warmup_reps=max(self.settings.warmup_reps, len(self.fns)) + len(self.pilot)
            + (len(self.blocks) + bool(self.pilot)) * self.timer.opening_calls,
            first_call_ms=self.first_call_ms,
            timer="device_event" if self.info.gpu_available else "perf_counter",
            cache_policy=_cache_policy(self.timer.flush.buffer is not None, len(self.fns)),
            stable=is_stable(stats["mean_ms"], stats["median_ms"], stats["cv"], len(samples)),
            times_ms=format_blocks(self.blocks),
            **found.as_row(),
            rel_ci=self.rel_ci,
            stop_reason=self.stop_reason,
            flush_bytes=self.timer.flush.nbytes,
        )


def _cache_policy(flushed: bool, n_fns: int) -> str:
    if flushed:
        return "flush" + (f"+rotate:{n_fns}" if n_fns > 1 else "")
    return f"rotate:{n_fns}" if n_fns > 1 else "none"


def measure(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    settings: TimingSettings | None = None,
    device: DeviceInfo | None = None,
    footprint_bytes: int = 0,
) -> Timing:
    """Time a zero-argument closure (or rotate over several); only the call itself is inside the timer.

    Blocks are taken until the stopping rule (:func:`judge`) says the median is known; before each the memory
    layout is re-drawn (see :class:`_Layout`) and the thread yields the CPU. ``times_ms`` keeps the blocks apart
    (``|``) for the run-vs-run comparison; ``footprint_bytes`` sizes the flush (:func:`flush_bytes`). A caller that
    must check what was timed uses :class:`Measurement` (its ``last``).
    """
    info = device or detect()
    measurement = Measurement(fn, settings or TimingSettings(), info, footprint_bytes=footprint_bytes)
    while not measurement.done:
        measurement.step()
    measurement.sustain_energy()
    return measurement.timing()


class _DeviceRest:
    """When this process's last energy block ended, so the next measurement can wait out its after-effect."""

    def __init__(self) -> None:
        self.block_end: float | None = None

    def loaded(self) -> None:
        self.block_end = time.monotonic()

    def settle(self) -> None:
        if self.block_end is not None:
            time.sleep(max(0.0, self.block_end + SETTLE_AFTER_ENERGY_BLOCK_S - time.monotonic()))
            self.block_end = None


_DEVICE_REST = _DeviceRest()


def _warm_up(fns: Sequence[Callable[[], object]], settings: TimingSettings, info: DeviceInfo) -> float:
    """The untimed first call (its wall time is returned: compilation lands here) and further warm-up calls,
    at least one per closure: a rotated input set first used inside the timed loop made the first block
    of a CPU measurement 1.5-15x slower than the rest (first-touch of its pages and allocations)."""
    synchronize(info)
    start = time.perf_counter()
    fns[0]()
    synchronize(info)
    first_call_ms = (time.perf_counter() - start) * 1e3
    for i in range(1, max(settings.warmup_reps, len(fns))):
        fns[i % len(fns)]()
    synchronize(info)
    return first_call_ms


class _BlockTimer:
    """Times blocks of repetitions, rotating the closures across the whole measurement."""

    def __init__(self, fns: Sequence[Callable[[], object]], info: DeviceInfo, flush: CacheFlusher,
                 interleaved: bool) -> None:
        self.fns, self.info, self.flush, self.interleaved = fns, info, flush, interleaved
        self.layout = _Layout(info.torch_device)
        self.count = 0
        self.last: tuple[int, object] = (0, None)
        # the device's energy counter, read around each block; every call and flush inside the blocks counted
        self.meter = energy.Meter(energy.counter(info.backend if info.gpu_available else "cpu"))
        self.calls = self.flushes = 0
        # untimed calls opening each block: the call above, and on a GPU the first timed repetition
        self.opening_calls = 0 if not interleaved else 2 if info.gpu_available else 1

    def block(self, reps: int) -> list[float]:
        self.layout.shuffle()
        # Yield the CPU between blocks: a block then starts on a fresh time slice instead of inheriting
        # the previous block's scheduling.
        time.sleep(0)
        times = self.meter.block(lambda: self._timed(reps))
        self.count += reps
        self.calls += reps + self.opening_calls
        self.flushes += reps + (self.opening_calls > 1)
        return times

    def _timed(self, reps: int) -> list[float]:
        if self.interleaved:
            # One untimed call first: after other cases the closure's launch path is cold, a host stall the
            # device events would count.
            self.fns[self.count % len(self.fns)]()
        if not self.info.gpu_available:
            return self._host_clock(reps)
        if self.interleaved:
            # The first timed repetition of an interleaved block can still start late (device events would
            # count the idle time as the kernel's), so it is run but not kept.
            return self._device_events(reps + 1)[1:]
        return self._device_events(reps)

    def energy_block(self, calls: int, span_s: float) -> tuple[energy.Meter, int, int]:
        """Blocks of ``calls`` more calls, as a timed block makes them, each between two reads of the counter, until
        they span ``span_s`` (the measurement's energy block, ``energy_span_s``); their times are not kept. Returns
        the counter's movement, the calls and the flushes it covers."""
        meter = energy.Meter(self.meter.source)
        total = flushes = 0
        for _ in range(MAX_ENERGY_BLOCKS):
            time.sleep(0)
            meter.block(lambda: self._timed(calls))
            total += calls + self.opening_calls
            flushes += calls + (self.opening_calls > 1)
            if meter.problem or meter.span_s >= span_s:
                break
        _DEVICE_REST.loaded()
        return meter, total, flushes

    def energy(self, call_ms: float, sustained: tuple[energy.Meter, int, int] | None = None) -> energy.Energy:
        """Energy of one call over every block timed so far, its mean power over ``call_ms``; or over the energy
        block where one ran, its mean power over the block's wall time a call (back to back, a call's device time
        understates it). The flushes before the repetitions are taken off."""
        if sustained:
            meter, calls, flushes = sustained
            call_ms = meter.span_s * 1e3 / max(calls, 1)
        else:
            meter, calls, flushes = self.meter, self.calls, self.flushes
        flush_j = 0.0
        if self.flush.buffer is not None and not meter.problem:
            key = (self.info.torch_device, int(self.flush.buffer.numel()))
            flush_j = energy.flush_joules(meter.source, key, self.flush, lambda: synchronize(self.info))
        return meter.per_call(calls, call_ms, flushes if self.flush.buffer is not None else 0, flush_j)

    def _host_clock(self, reps: int) -> list[float]:
        times = []
        for i in range(reps):
            self.flush()
            k = (self.count + i) % len(self.fns)
            t0 = time.perf_counter()
            result = self.fns[k]()
            times.append((time.perf_counter() - t0) * 1e3)
            self.last = (k, result)
        return times

    def _device_events(self, reps: int) -> list[float]:
        import torch

        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for i, (begin, end) in enumerate(events):
            self.flush()
            k = (self.count + i) % len(self.fns)
            begin.record()
            result = self.fns[k]()
            end.record()
            self.last = (k, result)
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) for begin, end in events]
