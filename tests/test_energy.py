"""Energy: the counter readers, the ROCm tools' recorded outputs, and what a measurement makes of a counter that
moves, is frozen, goes backwards or is missing."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
from fake_clock import install

from gpulab.core import energy
from gpulab.core.datasheet import datasheet_gbps, pct_of_datasheet
from gpulab.core.device import detect
from gpulab.core.timing import TimingSettings, measure

FIXTURES = Path(__file__).parent / "fixtures" / "env"


class Scripted:
    """A counter that answers the given readings in turn (joules), the last one from then on."""

    reason = ""
    source = "scripted"

    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def read(self) -> float | None:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


class AtPower:
    """A counter that moves with wall time at a steady ``watts``, as a device's does under load."""

    reason = ""
    source = "steady"

    def __init__(self, watts: float) -> None:
        self.watts = watts

    def read(self) -> float | None:
        return self.watts * time.perf_counter()


def _blocks(meter: energy.Meter, n: int, seconds: float = 0.0) -> None:
    for _ in range(n):
        meter.block(lambda: time.sleep(seconds))


def test_a_moving_counter_gives_the_energy_of_one_call_less_the_flushes():
    meter = energy.Meter(Scripted(100.0, 110.0, 110.0, 130.0))
    _blocks(meter, 2, seconds=energy.MIN_SPAN_S / 2 + 0.01)
    assert meter.joules == 30.0
    result = meter.per_call(calls=10, call_ms=500.0, flushes=10, flush_j=1.0)
    assert result.joules == pytest.approx(2.0) and result.watts == pytest.approx(4.0) and result.reason == ""
    assert result.as_row() == {"energy_j": result.joules, "power_w": result.watts, "energy_reason": ""}


def test_a_frozen_counter_is_unknown_never_zero():
    # https://github.com/ROCm/rocm_smi_lib/issues/180: an MI210's counter read 5198685762204 throughout a program's run.
    frozen = energy.Meter(Scripted(5198685762204 * 15.3e-6))
    _blocks(frozen, 2, seconds=energy.FROZEN_SPAN_S / 2 + 0.01)
    result = frozen.per_call(calls=100, call_ms=1.0)
    assert math.isnan(result.joules) and math.isnan(result.watts)
    assert result.reason.startswith("unknown: the counter did not move") and "(frozen)" in result.reason
    # Too short a span to expect a move: unknown too, but not called frozen.
    brief = energy.Meter(Scripted(7.0))
    _blocks(brief, 1)
    assert "below its update interval" in brief.per_call(calls=1, call_ms=1.0).reason


def test_blocks_shorter_than_the_update_interval_are_unknown_even_when_the_counter_moved():
    """NVML's counter steps every 20-100 ms: over a few short blocks its steps land in some and not in others."""
    meter = energy.Meter(Scripted(100.0, 112.0))
    _blocks(meter, 1)
    result = meter.per_call(calls=1, call_ms=12.0)
    assert math.isnan(result.joules) and "under the counter's update interval" in result.reason


def test_a_mean_power_above_the_boards_limit_is_unknown():
    counter = Scripted(100.0, 160.0)
    counter.limit_w = 700.0
    meter = energy.Meter(counter)
    _blocks(meter, 1, seconds=energy.MIN_SPAN_S + 0.01)
    too_much = meter.per_call(calls=5, call_ms=12.0)  # 12 J a 12 ms call: 1000 W on a 700 W board
    assert math.isnan(too_much.joules) and "above the board's 700 W limit" in too_much.reason
    assert meter.per_call(calls=5, call_ms=24.0).watts == pytest.approx(500.0)


def test_a_counter_that_goes_backwards_is_unknown():
    """A reset (NVML's counter restarts when the driver reloads) or a wrap (older AMD firmware's 32-bit count)."""
    meter = energy.Meter(Scripted(500.0, 520.0, 525.0, 3.0))  # the second block starts at 525 J and ends at 3 J
    _blocks(meter, 2)
    reason = meter.per_call(calls=2, call_ms=1.0).reason
    assert reason.startswith("unknown: the counter went backwards") and "wrapped or was reset" in reason


def test_nvml_counter_reads_millijoules_and_a_driver_reload_shows_as_a_reset():
    pynvml = pytest.importorskip("pynvml")
    readings = iter([1_000_000, 1_250_000, 1_300_000, 40])  # mJ since the driver loaded; the driver reloads

    class Library:
        NVMLError = pynvml.NVMLError

        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(handle: object) -> int:
            return next(readings)

    counter = energy.Nvml(Library, handle=object())
    meter = energy.Meter(counter)
    meter.block(lambda: None)
    assert meter.joules == pytest.approx(250.0)
    meter.block(lambda: None)
    assert "went backwards" in meter.per_call(calls=1, call_ms=1.0).reason


def test_an_nvml_that_stops_answering_is_unknown_with_its_error():
    pynvml = pytest.importorskip("pynvml")

    class Library:
        NVMLError = pynvml.NVMLError

        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(handle: object) -> int:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    meter = energy.Meter(energy.Nvml(Library, handle=None))
    meter.block(lambda: None)
    assert meter.per_call(calls=1, call_ms=1.0).reason.startswith("unknown: NVML stopped answering")


def test_without_nvidia_ml_py_the_counter_is_missing_with_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    found = energy._nvml_counter()
    assert isinstance(found, energy.Missing) and found.read() is None
    assert "pip install nvidia-ml-py" in found.reason


def test_nvml_without_a_driver_is_missing_not_a_crash():
    pytest.importorskip("pynvml")
    if detect().backend == "cuda":
        pytest.skip("an NVIDIA driver is loaded here")
    found = energy._nvml_counter()
    assert isinstance(found, energy.Missing) and found.reason.startswith("NVML did not start")


def test_a_cpu_run_has_no_counter_and_says_so():
    found = energy.counter("cpu")
    assert isinstance(found, energy.Missing) and "CPU" in found.reason


@pytest.mark.parametrize("name", ["amd_smi_metric_energy_rocm6.json", "amd_smi_metric_energy_rocm7.json"])
def test_amd_smi_energy_json_both_layouts(name):
    text = (FIXTURES / name).read_text()
    first, second = energy.parse_amd_smi_energy(text, 0), energy.parse_amd_smi_energy(text, 1)
    expected = {"amd_smi_metric_energy_rocm6.json": (20909145.914, 21111595.33),
                "amd_smi_metric_energy_rocm7.json": (20909188.578, 21111638.458)}[name]
    assert (first, second) == pytest.approx(expected)
    with pytest.raises(ValueError, match="no GPU 2"):
        energy.parse_amd_smi_energy(text, 2)


def test_amd_smi_recorded_second_moves_by_about_43_joules():
    """One second apart on an idle MI210 (the recorded -w 1 samples): ~43 J, i.e. ~43 W."""
    before = energy.parse_amd_smi_energy((FIXTURES / "amd_smi_metric_energy_rocm6.json").read_text())
    after = energy.parse_amd_smi_energy((FIXTURES / "amd_smi_metric_energy_rocm7.json").read_text())
    assert 40 < after - before < 45


def test_amd_smi_older_string_values_and_units():
    assert energy.parse_amd_smi_energy('[{"gpu": 0, "energy": {"total_energy_consumption": "1.004 J"}}]') == 1.004
    assert energy.parse_amd_smi_energy(
        '[{"gpu": 0, "energy": {"total_energy_consumption": {"value": 1500, "unit": "mJ"}}}]') == 1.5
    with pytest.raises(ValueError, match="N/A"):
        energy.parse_amd_smi_energy('[{"gpu": 0, "energy": {"total_energy_consumption": "N/A"}}]')


def test_rocm_smi_energy_counter_json():
    text = (FIXTURES / "rocm_smi_energy_mi250.json").read_text()
    assert energy.parse_rocm_smi_energy(text, 0) == pytest.approx(962825096.2974429)
    with pytest.raises(KeyError):
        energy.parse_rocm_smi_energy(text, 1)
    with pytest.raises(ValueError, match="no AMD GPU"):
        energy.parse_rocm_smi_energy(" \n", 0)


def test_a_tool_that_is_not_installed_is_missing_with_the_reason():
    counter = energy.Tool(("gpulab-no-such-smi", "--json"), energy.parse_rocm_smi_energy, 0)
    assert counter.read() is None and "not found on PATH" in counter.reason


@pytest.fixture
def clock(monkeypatch):
    """One fake clock for the timer, the counter's spans and the counter itself (AtPower reads it)."""
    from gpulab.core import timing

    fake = install(monkeypatch, timing, energy)
    monkeypatch.setattr(sys.modules[__name__], "time", fake.module())
    return fake


def takes(clock, seconds: float, calls: list[int] | None = None):
    """A closure whose every call takes ``seconds`` of the fake clock."""
    def call() -> None:
        if calls is not None:
            calls.append(1)
        clock.advance(seconds)
    return call


def test_measure_brackets_its_blocks_with_the_counter(monkeypatch, clock):
    """Every measured row carries the energy of one call: a counter moving at 50 W gives positive joules and a mean
    power of 50 W over the call's own time, once the timed blocks span the counter's update interval (a fixed count
    of 250 calls of 5 ms: 1.25 s)."""
    monkeypatch.setattr(energy, "counter", lambda backend: AtPower(50.0))
    timing = measure(takes(clock, 0.005), TimingSettings(min_reps=250, max_reps=250, flush_cache=False))
    assert timing.energy_reason == "" and timing.energy_j == pytest.approx(0.25)
    assert timing.power_w == pytest.approx(50.0)


def test_the_flush_energy_is_measured_once_per_size(monkeypatch, clock):
    monkeypatch.setattr(energy, "_FLUSH_JOULES", {})
    calls = []
    first = energy.flush_joules(AtPower(50.0), ("cpu", 1), lambda: (calls.append(1), clock.advance(0.01)),
                                lambda: None)
    again = energy.flush_joules(AtPower(50.0), ("cpu", 1), lambda: calls.append(1), lambda: None)
    assert first == again and first == pytest.approx(0.5) and len(calls) >= energy.FLUSH_ENERGY_S / 0.01 - 1e-6


def test_measure_with_a_frozen_counter_says_so(monkeypatch, clock):
    monkeypatch.setattr(energy, "counter", lambda backend: Scripted(12.0))
    timing = measure(takes(clock, 0.01), TimingSettings(min_reps=60, max_reps=60, flush_cache=False))
    assert math.isnan(timing.energy_j) and "(frozen)" in timing.energy_reason


def test_a_measurement_too_short_for_a_figure_does_not_read_the_counter(monkeypatch, clock):
    """Blocks planned to span under half the counter's update interval would give an unknown anyway: the counter
    is read around the pilot block and the first block only, and the reason says it was not read."""
    reads = []

    class Counting(AtPower):
        def read(self) -> float | None:
            reads.append(1)
            return super().read()

    monkeypatch.setattr(energy, "counter", lambda backend: Counting(50.0))
    timing = measure(takes(clock, 0.001), TimingSettings(min_time_s=0.05, max_wall_s=1.0, flush_cache=False))
    assert math.isnan(timing.energy_j) and timing.energy_reason.endswith("so it was not read")
    assert len(reads) == 4  # around the pilot block and the first planned block


def test_a_measurement_too_short_for_the_counter_reads_it_over_a_block_of_further_calls(monkeypatch, clock):
    """The MLP's, the LLM's and each benchmarked implementation's largest case ask for energy_span_s: where their
    timed blocks span less (the LLM's 3 prefills of a few milliseconds), a block of further calls spanning
    energy_span_s follows and gives the energy, while the timing keeps its own repetitions; without a counter
    nothing follows."""
    calls: list[int] = []
    call = takes(clock, 0.005, calls)
    monkeypatch.setattr(energy, "counter", lambda backend: AtPower(50.0))
    fixed = TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False,
                           energy_span_s=energy.ENERGY_SPAN_S)
    timing = measure(call, fixed)
    assert timing.reps == 3 and timing.energy_reason == "" and timing.energy_j == pytest.approx(0.25)
    energy_calls = len(calls) - 1 - 3  # after the warm-up and the timed calls: the energy block's, 1.5 s of them
    assert energy.ENERGY_SPAN_S / 0.005 <= energy_calls <= energy.ENERGY_SPAN_S / 0.005 + 1
    assert timing.power_w == pytest.approx(50.0)  # the block's mean power: its joules over its wall time
    without = measure(call, TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False))
    assert without.reps == 3 and math.isnan(without.energy_j)
    calls.clear()
    monkeypatch.setattr(energy, "counter", lambda backend: energy.Missing("no counter here"))
    timing = measure(call, fixed)
    assert timing.reps == 3 and len(calls) < 10 and timing.energy_reason == "unknown: no counter here"


def test_an_energy_block_is_repeated_until_it_spans_its_time(monkeypatch, clock):
    """Where MAX_ENERGY_CALLS calls span less than energy_span_s, the energy block is repeated, the counter read
    around each, until together they span it."""
    from gpulab.core import timing

    monkeypatch.setattr(energy, "counter", lambda backend: AtPower(50.0))
    monkeypatch.setattr(timing, "MAX_ENERGY_CALLS", 100)
    result = measure(takes(clock, 0.005), TimingSettings(min_reps=3, max_reps=3, flush_cache=False,
                                                         energy_span_s=energy.ENERGY_SPAN_S))
    assert result.energy_reason == "" and result.power_w == pytest.approx(50.0)


def test_the_measurement_after_an_energy_block_waits_for_the_device_to_settle(monkeypatch, clock):
    """An energy block runs the device flat out; its power limiter slows the calls right after it. The next
    measurement's first call comes SETTLE_AFTER_ENERGY_BLOCK_S after the block's end; without a block before it, a
    measurement starts at once."""
    from gpulab.core import timing

    starts: list[float] = []

    def call() -> None:
        starts.append(clock.now)
        clock.advance(0.005)

    monkeypatch.setattr(energy, "counter", lambda backend: AtPower(50.0))
    fixed = TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False,
                           energy_span_s=0.2)
    measure(call, fixed)
    block_end = starts[-1] + 0.005
    starts.clear()
    measure(call, TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False))
    assert starts[0] - block_end >= timing.SETTLE_AFTER_ENERGY_BLOCK_S
    begun = clock.now
    starts.clear()
    measure(call, TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1, flush_cache=False))
    assert starts[0] == begun


def test_measure_on_a_cpu_carries_the_columns_as_unknown():
    timing = measure(lambda: None, TimingSettings(min_time_s=0.01, max_wall_s=0.05))
    assert math.isnan(timing.energy_j) and timing.energy_reason.startswith("unknown: no GPU")


def test_per_unit_is_unknown_without_energy():
    assert energy.per_unit(0.5, 100) == 200.0 and energy.per_unit(2.0, 1e9, 1e-9) == 0.5
    assert all(math.isnan(energy.per_unit(e, 10)) for e in (math.nan, 0.0, None))


@pytest.mark.parametrize(("name", "gbps"), [
    ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA H200", 4800.0),
    ("NVIDIA A100-SXM4-80GB", 2039.0), ("AMD Instinct MI300X", 5300.0), ("AMD Instinct MI250X / MI250", 3276.8),
    ("AMD Radeon 8060S Graphics", 256.0)])
def test_datasheet_bandwidth_by_device_name(name, gbps):
    assert datasheet_gbps(name) == gbps
    assert pct_of_datasheet(gbps / 2, name) == (gbps, 50.0)


def test_an_unlisted_device_has_no_datasheet_figure():
    assert math.isnan(datasheet_gbps("cpu")) and math.isnan(pct_of_datasheet(10.0, "Some GPU")[1])


def test_the_amdsmi_library_reader_takes_either_accumulator_key():
    """amdsmi_get_energy_count's dict before ROCm 6.3, as https://github.com/AMDResearch/hpcfund/issues/21 shows it:
    {'power': 8152136, 'counter_resolution': 15.3, 'timestamp': ...}; later releases name it energy_accumulator."""
    for key in ("power", "energy_accumulator"):
        class Library:
            @staticmethod
            def amdsmi_get_energy_count(handle: object, key: str = key) -> dict:
                return {key: 8152136, "counter_resolution": 15.300000190734863, "timestamp": 3824190842400799}

        assert energy.AmdSmiLib(Library, handle=None).read() == pytest.approx(8152136 * 15.3e-6)


def test_without_the_amdsmi_library_the_rocm_reader_says_so():
    try:
        import amdsmi  # noqa: F401
    except ImportError:
        found = energy._amdsmi_counter(0)
        assert isinstance(found, energy.Missing) and found.reason.startswith("amdsmi library: ModuleNotFoundError")
    else:
        pytest.skip("the amdsmi library is installed here")


def test_a_reader_that_raises_does_not_lose_the_measurement():
    class Broken:
        reason = ""
        source = "broken"

        def read(self) -> float | None:
            raise OSError("the device went away")

    meter = energy.Meter(Broken())
    assert meter.block(lambda: 42) == 42
    assert meter.per_call(calls=1, call_ms=1.0).reason == "unknown: OSError: the device went away"
