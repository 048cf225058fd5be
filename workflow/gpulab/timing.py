"""The one timing function of the project.

Every measured figure goes through :func:`measure`: an untimed first call (compilation, autotuning and
handle creation land here and are reported separately as ``first_call_ms``), further warm-up calls,
then repetitions timed with device events on a GPU (``torch.cuda.Event`` is HIP on ROCm) or
``time.perf_counter`` on CPU, until both a minimum measured time and a minimum repetition count are
reached. Before each repetition a buffer larger than the last-level cache is overwritten (outside the
timed region) so repeated runs do not measure the cache; callers may also pass several closures over
different inputs, which are rotated.

Every summary carries its repetition times (``times_ms``, for run-vs-run statistics) and ``stable``:
false when the mean is more than 10% above the median (a stall in some repetitions), the coefficient of
variation exceeds 0.10, or fewer than 5 repetitions were taken (too few to judge either).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpulab.device import DeviceInfo, detect

# MI300X's Infinity Cache is 256 MiB and is not reported as L2, so flush more than that on any GPU.
GPU_FLUSH_BYTES = 512 * 2**20
CPU_FLUSH_BYTES = 64 * 2**20
# The stability rule: a row breaking any of these is reported as not stable.
MAX_MEAN_OVER_MEDIAN = 1.10
MAX_CV = 0.10
MIN_STABLE_REPS = 5


@dataclass(frozen=True)
class TimingSettings:
    min_time_s: float = 0.25
    min_reps: int = 10
    max_reps: int = 1000
    max_wall_s: float = 3.0
    warmup_reps: int = 3
    flush_cache: bool = True

    @classmethod
    def from_config(cls, timing_config: Mapping[str, Any] | None) -> TimingSettings:
        known = {k: v for k, v in (timing_config or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


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
    warmup_reps: int
    first_call_ms: float
    timer: str  # device_event | perf_counter
    cache_policy: str  # flush | rotate:N | none
    stable: bool = False  # see is_stable; measure() always sets it
    times_ms: str = ""  # every repetition's time, space-separated (format_times / parse_times)

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


def parse_times(text: object) -> np.ndarray:
    """The repetition times of a ``times_ms`` cell (empty when the row has none)."""
    if not isinstance(text, str) or not text.strip():
        return np.array([], dtype=np.float64)
    return np.array([float(t) for t in text.split()], dtype=np.float64)


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


class _CacheFlusher:
    def __init__(self, info: DeviceInfo, enabled: bool) -> None:
        self.buffer = None
        if not enabled:
            return
        import torch

        nbytes = GPU_FLUSH_BYTES if info.gpu_available else CPU_FLUSH_BYTES
        if info.gpu_available and info.total_memory_bytes:
            nbytes = min(nbytes, info.total_memory_bytes // 16)
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=info.torch_device)

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(1)


def measure(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    settings: TimingSettings | None = None,
    device: DeviceInfo | None = None,
    last: list[tuple[int, object]] | None = None,
) -> Timing:
    """Time a zero-argument closure (or rotate over several); only the call itself is inside the timer.

    ``last``, when given, receives (closure index, return value) of the last timed call, so the caller
    can check what was timed.
    """
    import torch

    settings = settings or TimingSettings()
    info = device or detect()
    fns = list(fn) if isinstance(fn, Sequence) else [fn]
    if not fns:
        raise ValueError("measure() needs at least one closure")
    gpu = info.gpu_available

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    sync()
    start = time.perf_counter()
    fns[0]()
    sync()
    first_call_ms = (time.perf_counter() - start) * 1e3
    for i in range(1, settings.warmup_reps):
        fns[i % len(fns)]()
    sync()

    flush = _CacheFlusher(info, settings.flush_cache)
    samples: list[float] = []
    total_ms = 0.0
    batch = settings.min_reps
    loop_start = time.perf_counter()
    while True:
        if gpu:
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(batch)
            ]
            for i, (begin, end) in enumerate(events):
                flush()
                k = (len(samples) + i) % len(fns)
                begin.record()
                result = fns[k]()
                end.record()
            torch.cuda.synchronize()
            new = [begin.elapsed_time(end) for begin, end in events]
        else:
            new = []
            for i in range(batch):
                flush()
                k = (len(samples) + i) % len(fns)
                t0 = time.perf_counter()
                result = fns[k]()
                new.append((time.perf_counter() - t0) * 1e3)
        samples.extend(new)
        total_ms += sum(new)
        wall_s = time.perf_counter() - loop_start
        enough_reps = len(samples) >= settings.min_reps
        if len(samples) >= settings.max_reps or (enough_reps and total_ms >= settings.min_time_s * 1e3):
            break
        # For tiny ops the cache flush, not the op, dominates the loop (a 64 MiB CPU flush costs ~10 ms):
        # cap the wall time rather than spend minutes flushing for a microsecond kernel.
        if enough_reps and wall_s >= settings.max_wall_s:
            break
        per_rep = max(total_ms / len(samples), 1e-4)
        wanted = math.ceil((settings.min_time_s * 1e3 - total_ms) / per_rep)
        wall_per_rep = wall_s / len(samples)
        affordable = max(1, math.floor((settings.max_wall_s - wall_s) / wall_per_rep)) if wall_per_rep > 0 else wanted
        wanted = min(wanted, affordable)
        batch = max(1, min(settings.max_reps - len(samples), max(wanted, settings.min_reps - len(samples))))

    if last is not None:
        last[:] = [(k, result)]
    stats = summarize(samples)
    if flush.buffer is not None:
        cache_policy = "flush" + (f"+rotate:{len(fns)}" if len(fns) > 1 else "")
    else:
        cache_policy = f"rotate:{len(fns)}" if len(fns) > 1 else "none"
    return Timing(
        **stats,
        reps=len(samples),
        warmup_reps=settings.warmup_reps,
        first_call_ms=first_call_ms,
        timer="device_event" if gpu else "perf_counter",
        cache_policy=cache_policy,
        stable=is_stable(stats["mean_ms"], stats["median_ms"], stats["cv"], len(samples)),
        times_ms=format_times(samples),
    )
