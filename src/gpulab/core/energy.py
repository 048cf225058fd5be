"""The device's cumulative energy counter, read around each measurement.

:class:`Counter` reads NVML's total energy, amdsmi, ``amd-smi`` or ``rocm-smi``; where there is none the reader is
:class:`Missing` and its reason is every row's ``energy_reason`` (unknown, never 0). :class:`Meter` brackets each
timed block and gives the energy of one call, less the cache flushes; a frozen or reset counter is unknown.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

# NVML's counter moves in steps tens of milliseconds apart: timed blocks spanning less than this in all give
# figures off by more than a tenth (on an H100, 0.1-0.3 s spans gave mean powers of 40 kW on a 700 W board).
MIN_SPAN_S = 1.0
# The span of the energy block a measurement whose timed blocks were too short for a figure runs after them
# (TimingSettings.energy_span_s: the MLP's, the LLM's and each benchmarked implementation's largest case per dtype).
ENERGY_SPAN_S = 1.5 * MIN_SPAN_S
# A measurement whose blocks, by its first one, will span less than this share of MIN_SPAN_S stops reading the counter.
SKIP_BELOW = 0.5
# A counter that has not moved over this long has stopped: its steps are at most about 100 ms apart.
FROZEN_SPAN_S = 0.25
# A mean power this far above the board's enforced limit is a counter artefact, never a measurement.
POWER_SLACK = 1.05
# The flushes' energy is measured over at least this much wall time, once per process and flush size.
FLUSH_ENERGY_S = 1.1 * MIN_SPAN_S
AMD_SMI_ARGS = ("amd-smi", "metric", "--energy", "--json")
ROCM_SMI_ARGS = ("rocm-smi", "--showenergycounter", "--json")


class Counter(Protocol):
    """A cumulative energy counter: ``read()`` in joules; ``reason`` says why there is none ('' when there is)."""

    reason: str
    source: str

    def read(self) -> float | None: ...


@dataclass
class Missing:
    """No counter here; ``reason`` is what the rows say."""

    reason: str
    source: str = "none"

    def read(self) -> float | None:
        return None


class Nvml:
    """NVML's total energy counter of the GPU torch uses (found by UUID, so CUDA_VISIBLE_DEVICES is honoured)."""

    source = "nvml"

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.pynvml, self.handle, self.reason = pynvml, handle, ""
        self.limit_w = _nvml_power_limit_w(pynvml, handle)

    def read(self) -> float | None:
        try:
            return self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3
        except self.pynvml.NVMLError as exc:
            self.reason = f"NVML stopped answering: {exc}"
            return None


class Tool:
    """A vendor tool's JSON energy figure, one process per read (tens to hundreds of ms: reads bracket blocks)."""

    def __init__(self, argv: tuple[str, ...], parse: Callable[[str, int], float], index: int) -> None:
        self.argv, self.parse, self.index, self.reason, self.source = argv, parse, index, "", argv[0]

    def read(self) -> float | None:
        from gpulab.core.tools import run_tool

        result = run_tool(self.argv[0], self.argv, timeout_s=10)
        if result.status != "ok":
            self.reason = f"{self.argv[0]}: {result.reason}"
            return None
        try:
            return self.parse(result.stdout, self.index)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.reason = f"{' '.join(self.argv)}: unreadable output ({exc})"
            return None


def _nvml_power_limit_w(pynvml: Any, handle: Any) -> float | None:
    """The board's enforced power limit in watts, the most a mean power can physically be; None if unknown."""
    try:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
    except Exception:  # NVML raises its own error types, and a stand-in may lack the call
        return None


def parse_amd_smi_energy(text: str, index: int = 0) -> float:
    """Joules of GPU ``index`` from ``amd-smi metric --energy --json``: a list of per-GPU objects (ROCm 6), or
    that list under ``gpu_data`` (ROCm 7), each ``{"gpu": N, "energy": {"total_energy_consumption":
    {"value": J, "unit": "J"}}}`` (older releases print the bare number or a "12.3 J" string)."""
    data = json.loads(text)
    gpus = data.get("gpu_data", data) if isinstance(data, dict) else data
    if isinstance(gpus, dict):
        gpus = [gpus]
    gpu = next((g for g in gpus if int(g.get("gpu", -1)) == index), None)
    if gpu is None:
        raise ValueError(f"no GPU {index} in amd-smi's output")
    value = gpu["energy"]["total_energy_consumption"]
    unit = "J"
    if isinstance(value, dict):
        value, unit = value["value"], value.get("unit", "J")
    if isinstance(value, str):
        number, _, unit = value.strip().partition(" ")
        value, unit = number, unit or "J"
    if str(value).upper() == "N/A":
        raise ValueError("amd-smi reports the energy counter as N/A")
    scale = {"J": 1.0, "mJ": 1e-3, "uJ": 1e-6}.get(unit.strip())
    if scale is None:
        raise ValueError(f"unknown energy unit {unit!r}")
    return float(value) * scale


def parse_rocm_smi_energy(text: str, index: int = 0) -> float:
    """Joules of card ``index`` from ``rocm-smi --showenergycounter --json``: "Accumulated Energy (uJ)" (the
    counter times its resolution, as rocm_smi.py's showEnergy prints it)."""
    if not text.strip():
        raise ValueError("rocm-smi printed nothing (no AMD GPU visible)")
    card = json.loads(text)[f"card{index}"]
    return float(card["Accumulated Energy (uJ)"]) / 1e6


def _nvml_counter() -> Counter:
    try:
        import pynvml
    except ImportError:
        return Missing("nvidia-ml-py is not installed (pip install nvidia-ml-py): no NVML energy counter")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission, ...
        return Missing(f"NVML did not start: {exc}")
    try:
        handle = nvml_handle(pynvml)
        if _mig_enabled(pynvml, handle):
            return Missing("MIG is on: NVML's energy counter is the whole GPU's, shared with the other instances")
        counter = Nvml(pynvml, handle)
        if counter.read() is None:
            return Missing(f"nvmlDeviceGetTotalEnergyConsumption: {counter.reason}")
        return counter
    except Exception as exc:  # NotSupported (before Volta), NoPermission, no such device
        return Missing(f"NVML energy counter unavailable: {type(exc).__name__}: {exc}")


def nvml_handle(pynvml: Any) -> Any:
    """The NVML device torch measures on: by its UUID (NVML numbers devices ignoring CUDA_VISIBLE_DEVICES), else
    by the first index CUDA_VISIBLE_DEVICES names."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:  # an older torch without .uuid, or a UUID NVML does not know
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        return pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


def _mig_enabled(pynvml: Any, handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlDeviceGetMigMode(handle)[0])
    except Exception:  # not a MIG-capable GPU, or a MIG device handle (whose parent has MIG on)
        return bool(getattr(pynvml, "nvmlDeviceIsMigDeviceHandle", lambda h: False)(handle))


class AmdSmiLib:
    """amd-smi's Python library (ROCm's ``share/amd_smi``), where importable: microseconds a read, where the CLI
    takes a process start. ``amdsmi_get_energy_count`` gives the accumulator and its resolution in µJ (the
    accumulator key is ``power`` before ROCm 6.3 and ``energy_accumulator`` from then on)."""

    source = "amdsmi"

    def __init__(self, amdsmi: Any, handle: Any) -> None:
        self.amdsmi, self.handle, self.reason = amdsmi, handle, ""

    def read(self) -> float | None:
        try:
            count = self.amdsmi.amdsmi_get_energy_count(self.handle)
            accumulator = count.get("energy_accumulator", count.get("power"))
            return float(accumulator) * float(count["counter_resolution"]) / 1e6
        except Exception as exc:  # AmdSmiLibraryException and unexpected layouts alike
            self.reason = f"amdsmi_get_energy_count: {exc}"
            return None


def _amdsmi_counter(index: int) -> Counter:
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        counter = AmdSmiLib(amdsmi, amdsmi.amdsmi_get_processor_handles()[index])
    except Exception as exc:  # not installed, no driver, no such GPU
        return Missing(f"amdsmi library: {type(exc).__name__}: {exc}")
    return counter if counter.read() is not None else Missing(counter.reason)


def _rocm_counter() -> Counter:
    visible = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("ROCR_VISIBLE_DEVICES") or "0"
    index = int(visible.split(",")[0]) if visible.split(",")[0].isdigit() else 0
    library = _amdsmi_counter(index)
    if not library.reason:
        return library
    reasons = [library.reason]
    for argv, parse in ((AMD_SMI_ARGS, parse_amd_smi_energy), (ROCM_SMI_ARGS, parse_rocm_smi_energy)):
        counter = Tool(argv, parse, index)
        if counter.read() is not None:
            return counter
        reasons.append(counter.reason)
    return Missing("no AMD energy counter: " + "; ".join(reasons))


@functools.cache
def counter(backend: str) -> Counter:
    """The energy counter of the device a ``backend`` run measures on (once per process)."""
    if backend == "cuda":
        found = _nvml_counter()
    elif backend == "rocm":
        found = _rocm_counter()
    else:
        found = Missing("no GPU: a CPU run has no device energy counter (the host's RAPL is not read)")
    log.info("energy counter: %s", found.source if not found.reason else f"unknown ({found.reason})")
    return found


@dataclass(frozen=True)
class Energy:
    """Energy of one call of a measurement: ``joules`` (NaN when unknown), mean ``watts``, or why unknown."""

    joules: float = math.nan
    watts: float = math.nan
    reason: str = ""

    def as_row(self) -> dict[str, Any]:
        return {"energy_j": self.joules, "power_w": self.watts, "energy_reason": self.reason}


class Meter:
    """The counter's movement over the blocks of one measurement: bracket each block with :meth:`block`."""

    def __init__(self, source: Counter) -> None:
        self.source = source
        self.joules = 0.0
        self.span_s = 0.0
        self.problem = source.reason

    def expect(self, span_s: float) -> None:
        """Read no more where all the blocks together will span under SKIP_BELOW of MIN_SPAN_S: the figure would
        be unknown anyway, and a read can cost milliseconds (NVML's, on some drivers) inside a device's hold."""
        if not self.problem and span_s < SKIP_BELOW * MIN_SPAN_S:
            self.problem = (f"the timed blocks span about {span_s:.2g} s, under the counter's update interval "
                            f"({MIN_SPAN_S} s): too short to attribute its steps to them, so it was not read")

    def block(self, run: Callable[[], Any]) -> Any:
        """Run one block between two reads of the counter."""
        if self.problem:
            return run()
        before, start = self._read(), time.perf_counter()
        result = run()
        after, end = self._read(), time.perf_counter()
        if before is None or after is None:
            self.problem = self.source.reason or "the counter could not be read"
        elif after < before:
            self.problem = f"the counter went backwards ({before:.3f} J to {after:.3f} J): it wrapped or was reset"
        else:
            self.joules += after - before
            self.span_s += end - start
        return result

    def _read(self) -> float | None:
        """The counter, or None: a reader that raises must not lose the measurement it brackets."""
        try:
            return self.source.read()
        except Exception as exc:
            self.source.reason = self.source.reason or f"{type(exc).__name__}: {exc}"
            return None

    def per_call(self, calls: int, call_ms: float, flushes: int = 0, flush_j: float = 0.0) -> Energy:
        """Energy of one call: the blocks' joules less ``flushes`` x ``flush_j``, over ``calls``; its mean power
        over the call's time ``call_ms``."""
        if self.problem:
            return Energy(reason=f"unknown: {self.problem}")
        if self.joules == 0:
            why = "frozen" if self.span_s >= FROZEN_SPAN_S else "below its update interval"
            return Energy(reason=f"unknown: the counter did not move in {self.span_s:.3g} s ({why})")
        if self.span_s < MIN_SPAN_S:
            return Energy(reason=f"unknown: the timed blocks span {self.span_s:.3g} s, under the counter's update "
                          f"interval ({MIN_SPAN_S} s): too short to attribute its steps to them")
        if math.isnan(flush_j):
            return Energy(reason="unknown: the cache flush's energy could not be measured")
        joules = (self.joules - flushes * flush_j) / max(calls, 1)
        if not joules > 0:
            return Energy(reason=f"unknown: the calls' energy is within the counter's resolution after the "
                          f"{flushes} cache flushes' {flushes * flush_j:.3g} J are taken off {self.joules:.3g} J")
        watts = joules / (call_ms / 1e3) if call_ms > 0 else math.nan
        limit = getattr(self.source, "limit_w", None)
        if limit and watts > limit * POWER_SLACK:
            return Energy(reason=f"unknown: a mean power of {watts:.0f} W is above the board's {limit:.0f} W limit "
                          "(the counter's steps do not line up with these calls)")
        return Energy(joules, watts)


_FLUSH_JOULES: dict[tuple[str, int], float] = {}


def flush_joules(source: Counter, key: tuple[str, int], flush: Callable[[], None], sync: Callable[[], None]) -> float:
    """Joules of one cache flush (``flush``), measured once per process and ``key`` over FLUSH_ENERGY_S."""
    if key not in _FLUSH_JOULES:
        meter, calls = Meter(source), 0

        def run() -> None:
            nonlocal calls
            deadline = time.perf_counter() + FLUSH_ENERGY_S
            while time.perf_counter() < deadline:
                flush()
                calls += 1
            sync()

        meter.block(run)
        energy = meter.per_call(calls, 1.0)
        _FLUSH_JOULES[key] = energy.joules
    return _FLUSH_JOULES[key]


def per_unit(energy_j: float, units: float, scale: float = 1.0) -> float:
    """``units`` per joule (x ``scale``): tokens/J, GB/J, TFLOP/J; NaN when the energy is unknown."""
    if energy_j is None or not energy_j > 0 or not units or (isinstance(units, float) and math.isnan(units)):
        return math.nan
    return units / energy_j * scale
