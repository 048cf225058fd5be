"""The core split of a local run on a GPU host: the job measuring on the device keeps cores of its own.

The Snakefile picks the measuring cores once (:func:`plan`) and names them in the run's state (gpulab.core.jobenv);
every job starts on the other cores (:func:`confine_job`), the job that claims the device moves to them
(:func:`enter_measuring`); :class:`LoadMeter` records how busy other processes kept the host meanwhile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path

from gpulab.core import jobenv

log = logging.getLogger(__name__)

SYSFS_CPU = Path("/sys/devices/system/cpu")
HOST_LOAD = "host_load"


def parse_cpus(text: str) -> frozenset[int]:
    """A kernel CPU list (``0-3,8,10-11``) as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (a cluster job's allocation, where it has one)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def physical_cores(cpus: Iterable[int], sysfs: Path = SYSFS_CPU) -> list[frozenset[int]]:
    """The CPUs grouped by physical core (SMT siblings together), in CPU order; a CPU whose topology is not
    readable is a core of its own."""
    cpus = frozenset(cpus)
    groups: dict[frozenset[int], None] = {}
    for cpu in sorted(cpus):
        try:
            siblings = parse_cpus((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = frozenset()
        groups[(siblings & cpus) | {cpu}] = None
    return list(groups)


def measure_count(setting: int | str, available: int) -> int:
    """How many CPUs the measuring job keeps: ``measure_cores`` (auto: a quarter of the run's, at least one),
    always leaving one to the other jobs; 0 (no split) on one CPU."""
    if available < 2:
        return 0
    wanted = max(1, available // 4) if setting == "auto" else int(setting)
    return max(1, min(wanted, available - 1))


def split(cpus: Iterable[int], setting: int | str, sysfs: Path = SYSFS_CPU) -> frozenset[int]:
    """The measuring CPUs among ``cpus``: whole physical cores from the highest-numbered (CPU 0 serves most of
    the kernel's interrupts), so no other job runs on an SMT sibling of the measurement; at least one CPU is
    always left to the other jobs."""
    cpus = frozenset(cpus)
    count = measure_count(setting, len(cpus))
    chosen: set[int] = set()
    for core in reversed(physical_cores(cpus, sysfs)):
        if len(chosen) >= count:
            break
        if len(chosen) + len(core) <= len(cpus) - 1:
            chosen |= core
    if count and not chosen:  # one core's siblings are all there is: split them
        chosen = {max(cpus)}
    return frozenset(chosen)


def plan(setting: int | str, *, enabled: bool, environ: MutableMapping[str, str] | None = None,
         cpus: Iterable[int] | None = None, sysfs: Path = SYSFS_CPU) -> frozenset[int]:
    """Name this run's measuring CPUs for its jobs (they inherit ``environ``), or name none where jobs do not
    measure beside each other (``enabled`` false: a cluster run, a CPU-only host, one job at a time)."""
    environ = os.environ if environ is None else environ
    measuring = split(allowed_cpus() if cpus is None else cpus, setting, sysfs) if enabled else frozenset()
    jobenv.put("measure_cores", format_cpus(measuring) if measuring else None, environ)
    return measuring


def measuring_cpus(environ: Mapping[str, str] | None = None) -> frozenset[int]:
    text = jobenv.get("measure_cores", environ) or ""
    return parse_cpus(text) if text else frozenset()


def job_cpus(allowed: Iterable[int], measuring: Iterable[int], *, measures: bool) -> frozenset[int]:
    """The CPUs of a job that ``measures`` (holds the device) or not, within what it may use (``allowed``: its
    allocation): the measuring ones, or all the others; unchanged where that would leave it none."""
    allowed, measuring = frozenset(allowed), frozenset(measuring)
    mine = allowed & measuring if measures else allowed - measuring
    return mine or allowed


def set_process_cpus(cpus: Iterable[int], tasks: Path = Path("/proc/self/task")) -> None:
    """Move every thread of this process to ``cpus`` (sched_setaffinity moves one thread; threads and child
    processes started later inherit it from theirs)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = set(cpus)
    try:
        tids = [int(name) for name in os.listdir(tasks)]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
        except OSError as exc:  # CPUs outside this job's allocation (cgroup cpuset): it keeps its own
            log.warning("kept the CPUs of this job: cannot move it to CPUs %s (%s)", format_cpus(cpus), exc)
            return


def confine_job(environ: Mapping[str, str] | None = None) -> frozenset[int] | None:
    """Keep this job off the measuring CPUs (every job starts so; the one that claims the device moves onto them);
    returns its CPUs, or None where the run names no measuring CPUs."""
    return _move(environ, measures=False)


def enter_measuring(environ: Mapping[str, str] | None = None) -> frozenset[int] | None:
    """Move this process, which now holds the device, onto the measuring CPUs (None: the run names none); its
    load meter starts again, over the run's CPUs (taken before the move narrows this process's own)."""
    run_cpus = allowed_cpus() | measuring_cpus(environ)
    cpus = _move(environ, measures=True)
    _METER["meter"] = LoadMeter(run_cpus)  # its measurement starts now
    return cpus


def _move(environ: Mapping[str, str] | None, *, measures: bool) -> frozenset[int] | None:
    measuring = measuring_cpus(environ)
    if not measuring:
        return None
    # The run's CPUs: what this job may use now, plus the measuring ones it may have been kept off.
    cpus = job_cpus(allowed_cpus() | measuring, measuring, measures=measures)
    set_process_cpus(cpus)
    return cpus


def read_cpu_times(text: str | None = None) -> dict[int, tuple[int, int]]:
    """Busy and total ticks of each CPU since boot (``/proc/stat``; idle and iowait are not busy, guest time is
    already counted in user time)."""
    if text is None:
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return {}
    times = {}
    for line in text.splitlines():
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit():
            ticks = [int(f) for f in fields[:8]]
            total = sum(ticks)
            times[int(name[3:])] = (total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total)
    return times


def own_cpu_s() -> float:
    """CPU seconds of this process and of its child processes that ended."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMeter:
    """The share of the run's CPUs that processes other than this one (and its ended children) kept busy between
    its start and :meth:`load`."""

    def __init__(self, cpus: Iterable[int] | None = None,
                 cpu_times: Callable[[], dict[int, tuple[int, int]]] = read_cpu_times,
                 own: Callable[[], float] = own_cpu_s, ticks_per_s: float | None = None) -> None:
        self.cpus = frozenset(cpus) if cpus is not None else allowed_cpus() | measuring_cpus()
        self._times, self._own = cpu_times, own
        self.ticks_per_s = ticks_per_s or float(os.sysconf("SC_CLK_TCK"))
        self._start, self._own_start = self._times(), self._own()

    def load(self) -> float | None:
        """0 (nothing else ran) to 1 (every CPU busy with other work); None where no tick has passed or the
        counters are not readable."""
        now = self._times()
        cpus = [c for c in self.cpus if c in now and c in self._start]
        busy = sum(now[c][0] - self._start[c][0] for c in cpus)
        total = sum(now[c][1] - self._start[c][1] for c in cpus)
        if total <= 0:
            return None
        others = busy - (self._own() - self._own_start) * self.ticks_per_s
        return min(1.0, max(0.0, others / total))


_METER: dict[str, LoadMeter | None] = {"meter": None}


def start_load_meter() -> LoadMeter:
    """Start this job's meter (a claim of the device restarts it: :func:`enter_measuring`)."""
    _METER["meter"] = LoadMeter()
    return _METER["meter"]


def current_load() -> float | None:
    meter = _METER["meter"]
    return meter.load() if meter is not None else None


def stamp_host_load(paths: Iterable[str | os.PathLike[str]], load: float | None) -> list[Path]:
    """Write ``load`` into the ``host_load`` cells of the measured rows (a median time) of each CSV table among
    ``paths`` whose rows carry none yet; returns the tables written. Cells are read and written as text, so every
    other cell stays as it was."""
    if load is None:
        return []
    import pandas as pd

    from gpulab.core.tables import write_atomic

    written = []
    for path in map(Path, paths):
        if path.suffix != ".csv" or not path.is_file():
            continue
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        if HOST_LOAD not in table.columns or "median_ms" not in table.columns or (table[HOST_LOAD] != "").any():
            continue
        table.loc[table["median_ms"] != "", HOST_LOAD] = f"{load:.3f}"
        write_atomic(path, table.to_csv(index=False))
        written.append(path)
    return written
