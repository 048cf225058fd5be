"""The one timing function of the project.

Every measured figure goes through :func:`measure`: an untimed first call (compilation, autotuning and
handle creation land here and are reported separately as ``first_call_ms``), further warm-up calls,
then repetitions timed with device events on a GPU (``torch.cuda.Event`` is HIP on ROCm) or
``time.perf_counter`` on CPU, until both a minimum measured time and a minimum repetition count are
reached. The repetitions are taken in blocks (``blocks``, default 8): the first block sizes the rest, and
before each block the memory layout is re-drawn and the CPU yielded, so that what differs from one run to
the next (where the op's outputs land, what else the machine runs) also varies between blocks of one
run, where the run-vs-run comparison can see it (``gpulab.report.compare``); :class:`Measurement` takes
one block at a time, so the bench runner can interleave the blocks of a cell's cases over
``min_span_s`` of wall time (states of a shared CPU outlast one measurement). Before each repetition a
buffer larger than the last-level cache is read (outside the timed region) so repeated runs do
not measure the cache; callers may also pass several closures over different inputs, which are rotated.

Every summary carries its repetition times (``times_ms``, in timed order, blocks separated by ``|``, for
run-vs-run statistics) and ``stable``: false when the mean is more than 10% above the median (a stall in
some repetitions), the coefficient of variation exceeds 0.10, or fewer than 5 repetitions were taken
(too few to judge either).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gpulab.core import energy
from gpulab.core.device import DeviceInfo, detect, synchronize

# MI300X's Infinity Cache is 256 MiB and is not reported as L2, so flush more than that on any GPU. Not less on a
# GPU with a smaller cache either: the flush is also the host's head start, the time it has to issue a launch-bound
# op's kernels before the device reaches them (docs/decisions.md, "Energy reads and the flush held the device").
GPU_FLUSH_BYTES = 512 * 2**20
CPU_FLUSH_BYTES = 64 * 2**20
# The stability rule: a row breaking any of these is reported as not stable.
MAX_MEAN_OVER_MEDIAN = 1.10
MAX_CV = 0.10
MIN_STABLE_REPS = 5
# Wall-time cap of one measurement (``max_wall_s: auto``): on a CPU the flush before each repetition, not a small op,
# sets the cost, and the run-vs-run interval comes from the spread between blocks, not their length.
GPU_MAX_WALL_S = 3.0
CPU_MAX_WALL_S = 0.5
# Measured time a measurement collects (``min_time_s: auto``): a GPU's repetitions agree closely, a shared CPU
# drifts for seconds (evidence: docs/decisions.md).
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
# Most calls of a measurement's energy block (a device event pair each): an op shorter than energy_span_s over this
# gives no energy figure rather than a block of millions of calls.
MAX_ENERGY_CALLS = 10_000
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
    # Where the timed blocks span too little for the energy counter (gpulab.core.energy.MIN_SPAN_S) and the device has
    # one: a block of further calls after them, spanning this long, is read for the energy alone (its times are not
    # kept, so the timing is what it would be without it). 0: none (a bench cell's interleaved cases).
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
        return resolved


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

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


TIMING_COLUMNS = tuple(Timing.__dataclass_fields__)


def is_stable(mean_ms: float, median_ms: float, cv: float, reps: int) -> bool:
    """The stability rule (see the module docstring)."""
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
    cache = info.l2_cache_bytes or 64 * 2**20
    return max(1, min(MAX_ROTATION, math.ceil(2 * cache / max(1, bytes_per_set))))


def flush_bytes(info: DeviceInfo) -> int:
    """Bytes the cache flush reads on ``info``'s device: GPU_FLUSH_BYTES, at most a sixteenth of a GPU's memory."""
    if not info.gpu_available:
        return CPU_FLUSH_BYTES
    return min(GPU_FLUSH_BYTES, info.total_memory_bytes // 16) if info.total_memory_bytes else GPU_FLUSH_BYTES


class CacheFlusher:
    """Reads a buffer larger than the last-level cache (before each repetition, outside the timer).

    Reading, not writing: a flush that overwrites its buffer leaves the cache full of dirty lines, and
    the timed op then pays for writing them back (on the H100, up to 50 MB extra traffic on a 64 MiB copy
    whose own traffic is 128 MiB). Read, the cache holds clean lines that are evicted for free.
    """

    def __init__(self, info: DeviceInfo, enabled: bool) -> None:
        self.buffer = None
        self.sink = None
        if not enabled:
            return
        import torch

        nbytes = flush_bytes(info)
        # float32: PyTorch's integer sum on a CPU is 50x slower than its vectorised float sum.
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=info.torch_device)
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


def _block_plan(settings: TimingSettings, pilot_ms: Sequence[float], pilot_wall_s: float) -> list[int]:
    """Repetitions of each block, from the pilot block: enough for ``min_time_s`` and ``min_reps`` over all
    blocks, within ``max_reps`` and (once ``min_reps`` are reached) within ``max_wall_s``."""
    done = len(pilot_ms)
    per_rep_ms = max(float(np.median(pilot_ms)), 1e-4)
    wanted = max(settings.min_reps, math.ceil(settings.min_time_s * 1e3 / per_rep_ms))
    # For tiny ops the cache flush, not the op, dominates the loop (a 64 MiB CPU flush costs ~10 ms):
    # cap the wall time rather than spend minutes flushing for a microsecond kernel.
    affordable = math.floor(settings.max_wall_s / max(pilot_wall_s / done, 1e-9))
    return _split(min(settings.max_reps, max(settings.min_reps, min(wanted, affordable))), settings.blocks)


def _split(total: int, blocks: int) -> list[int]:
    """``total`` repetitions in at most ``blocks`` blocks of near-equal size."""
    sizes = [len(part) for part in np.array_split(np.arange(total), blocks)]
    return [n for n in sizes if n > 0]


class Measurement:
    """One measurement taken block by block, so several can be interleaved (the bench runner takes a cell's
    cases in turn).

    Construction does the untimed first call, the warm-up and the pilot block that sizes the rest;
    :meth:`step` takes the next block; :meth:`timing` summarises the kept blocks. ``flusher`` may be
    shared between measurements that run together (one cache-sized buffer, not one each);
    ``interleaved`` opens each block with an untimed call, as other closures ran in between.
    """

    def __init__(self, fn: Callable[[], object] | Sequence[Callable[[], object]], settings: TimingSettings,
                 info: DeviceInfo, flusher: CacheFlusher | None = None, interleaved: bool = False) -> None:
        self.fns = list(fn) if isinstance(fn, Sequence) else [fn]
        if not self.fns:
            raise ValueError("measure() needs at least one closure")
        self.settings, self.info = settings.for_device(info), info
        _DEVICE_REST.settle()
        self.first_call_ms = _warm_up(self.fns, self.settings, info)
        self.timer = _BlockTimer(self.fns, info, flusher or CacheFlusher(info, self.settings.flush_cache),
                                 interleaved)
        # A pilot block sizes the blocks and is not kept: the first repetitions after the layout moves pay
        # first-touch costs. A fixed count (min_reps = max_reps: the LLM figures) has nothing to size.
        self.pilot: list[float] = []
        if self.settings.min_reps >= self.settings.max_reps:
            self.plan = _split(self.settings.max_reps, self.settings.blocks)
        else:
            wall = time.perf_counter()
            self.pilot = self.timer.block(max(1, math.ceil(self.settings.min_reps / self.settings.blocks)))
            self.plan = _block_plan(self.settings, self.pilot, time.perf_counter() - wall)
        self.blocks: list[list[float]] = []
        self.sustained: tuple[energy.Meter, int] | None = None  # the energy block's counter and calls, where one ran

    @property
    def done(self) -> bool:
        return len(self.blocks) == len(self.plan)

    @property
    def last(self) -> tuple[int, object]:
        """(closure index, return value) of the last timed call, so the caller can check what was timed."""
        return self.timer.last

    def pair_with(self, other: Measurement) -> None:
        """Take this measurement's repetitions in as many blocks as ``other``, so it can time one block beside
        each of the other's (a reference paired block by block with a case)."""
        blocks = len(other.plan)
        self.plan = _split(max(sum(self.plan), blocks), blocks)

    def step(self) -> None:
        """Time the next block; after the first, the blocks' span is known well enough to tell whether the energy
        counter can give a figure (the pilot's few repetitions are dominated by per-block costs)."""
        start = time.perf_counter()
        self.blocks.append(self.timer.block(self.plan[len(self.blocks)]))
        if len(self.blocks) == 1:
            self.timer.meter.expect((time.perf_counter() - start) / self.plan[0] * sum(self.plan))
        meter = self.timer.meter
        if self.done and self.settings.energy_span_s and not meter.source.reason and meter.span_s < energy.MIN_SPAN_S:
            # sized by a call's median time: back to back a call takes at least that, so the block spans at least
            # energy_span_s (the timed blocks' wall time a call counts each block's own costs as well)
            call_s = float(np.median([t for block in self.blocks for t in block])) / 1e3
            calls = min(math.ceil(self.settings.energy_span_s / max(call_s, 1e-6)), MAX_ENERGY_CALLS)
            self.sustained = (self.timer.energy_block(calls), calls)

    def timing(self) -> Timing:
        samples = [t for block in self.blocks for t in block]
        stats = summarize(samples)
        return Timing(
            **stats,
            reps=len(samples),
            # every untimed call: warm-up, the pilot block (and the calls opening each interleaved block)
            warmup_reps=max(self.settings.warmup_reps, len(self.fns)) + len(self.pilot)
            + (len(self.blocks) + bool(self.pilot)) * self.timer.opening_calls,
            first_call_ms=self.first_call_ms,
            timer="device_event" if self.info.gpu_available else "perf_counter",
            cache_policy=_cache_policy(self.settings, len(self.fns)),
            stable=is_stable(stats["mean_ms"], stats["median_ms"], stats["cv"], len(samples)),
            times_ms=format_blocks(self.blocks),
            **self.timer.energy(stats["mean_ms"], self.sustained).as_row(),
        )


def _cache_policy(settings: TimingSettings, n_fns: int) -> str:
    if settings.flush_cache:
        return "flush" + (f"+rotate:{n_fns}" if n_fns > 1 else "")
    return f"rotate:{n_fns}" if n_fns > 1 else "none"


def measure(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    settings: TimingSettings | None = None,
    device: DeviceInfo | None = None,
) -> Timing:
    """Time a zero-argument closure (or rotate over several); only the call itself is inside the timer.

    The repetitions are taken in ``settings.blocks`` blocks; before each block the memory layout is
    re-drawn (see :class:`_Layout`) and the thread yields the CPU, so each block is a fresh sample of the
    conditions a run meets. ``times_ms`` keeps the blocks apart (``|``) for the run-vs-run comparison.
    A caller that must check what was timed uses :class:`Measurement` (its ``last``).
    """
    info = device or detect()
    measurement = Measurement(fn, settings or TimingSettings(), info)
    while not measurement.done:
        measurement.step()
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

    def energy_block(self, calls: int) -> energy.Meter:
        """``calls`` more calls, as a timed block makes them, between two reads of the counter; their times are not
        kept (the measurement's energy block, ``energy_span_s``)."""
        meter = energy.Meter(self.meter.source)
        time.sleep(0)
        meter.block(lambda: self._timed(calls))
        _DEVICE_REST.loaded()
        return meter

    def energy(self, call_ms: float, sustained: tuple[energy.Meter, int] | None = None) -> energy.Energy:
        """Energy of one call over every block timed so far, its mean power over ``call_ms``; or over the energy
        block where one ran, its mean power over the block's wall time a call (back to back, a call's device time
        understates it). The flushes before the repetitions are taken off: one a call in the energy block."""
        if sustained:
            meter, calls = sustained
            flushes, call_ms = calls, meter.span_s * 1e3 / max(calls, 1)
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
