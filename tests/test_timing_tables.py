from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_clock import install

from gpulab.core.device import DeviceInfo
from gpulab.core.smi import gpu_state, parse_nvidia_state, parse_rocm_state, throttled
from gpulab.core.tables import Column, SchemaError, TableSchema, write_atomic
from gpulab.core.timing import (
    CPU_FLUSH_BYTES,
    TIMING_COLUMNS,
    Measurement,
    TimingSettings,
    flush_bytes,
    is_stable,
    measure,
    parse_times,
    summarize,
)

ENV_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "env"


def test_summarize_statistics():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats["median_ms"] == 3.0
    assert stats["min_ms"] == 1.0
    assert stats["p10_ms"] == pytest.approx(1.4)
    assert stats["p90_ms"] == pytest.approx(61.6)
    assert stats["cv"] == pytest.approx(pd.Series([1, 2, 3, 4, 100.0]).std() / 22.0)


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])


def test_measure_counts_calls_and_honours_minimums():
    calls = []
    settings = TimingSettings(min_time_s=0.01, min_reps=7, max_reps=50, warmup_reps=2, flush_cache=False)
    timing = measure(lambda: calls.append(1), settings)
    assert 7 <= timing.reps <= 50
    assert len(calls) == timing.reps + timing.warmup_reps and timing.warmup_reps >= settings.warmup_reps
    assert timing.timer == "perf_counter" and timing.cache_policy == "none"
    assert set(timing.as_row()) == set(TIMING_COLUMNS)


def test_a_fixed_count_runs_no_pilot_block():
    """min_reps = max_reps (the LLM figures: runs of seconds each): the first call is the only untimed one."""
    calls = []
    timing = measure(lambda: calls.append(1), TimingSettings(min_time_s=1e-9, min_reps=3, max_reps=3, warmup_reps=1,
                                                             flush_cache=False))
    assert len(calls) == 4 and timing.reps == 3 and timing.warmup_reps == 1


def test_interleaved_blocks_count_every_untimed_call_on_this_device():
    """Each interleaved block opens with untimed calls (on a GPU also its first timed repetition, dropped):
    every call is either a kept repetition or counted in warmup_reps, on whatever device runs the test."""
    from gpulab.core.device import detect

    info = detect()
    calls = []
    fn = (lambda: calls.append(1)) if not info.gpu_available else _gpu_closure(calls)
    settings = TimingSettings(min_time_s=0.001, min_reps=16, max_reps=17, warmup_reps=2, flush_cache=False,
                              min_span_s=0)
    m = Measurement(fn, settings, info, interleaved=True)
    while not m.done:
        m.step()
    timing = m.timing()
    assert 16 <= timing.reps <= 17 and len(calls) == timing.reps + timing.warmup_reps and m.pilot
    opening = 2 if info.gpu_available else 1
    assert timing.warmup_reps == 2 + len(m.pilot) + (len(m.blocks) + bool(m.pilot)) * opening


def _gpu_closure(calls: list) -> object:
    import torch

    x = torch.ones(1 << 20, device="cuda")

    def run():
        calls.append(1)
        return x * 2

    return run


def test_measure_reports_first_call_separately(monkeypatch):
    import gpulab.core.timing as timing_module

    clock = install(monkeypatch, timing_module)
    state = {"first": True}

    def slow_first():
        clock.advance(0.05 if state["first"] else 0.001)
        state["first"] = False

    timing = measure(slow_first, TimingSettings(min_time_s=0.001, min_reps=5, flush_cache=False))
    assert timing.first_call_ms == pytest.approx(50)
    assert timing.median_ms == pytest.approx(1)


def test_measure_rotates_inputs():
    seen = []
    fns = [lambda i=i: seen.append(i) for i in range(3)]
    timing = measure(fns, TimingSettings(min_time_s=0.001, min_reps=6, max_reps=6, warmup_reps=1, flush_cache=True))
    assert set(seen) == {0, 1, 2}
    assert timing.cache_policy == "flush+rotate:3"


SCHEMA = TableSchema("demo", (Column("op", "str"), Column("size", "int")), measured=True)


def test_schema_rejects_undeclared_and_bad_status(tmp_path):
    with pytest.raises(SchemaError, match="undeclared"):
        SCHEMA.frame([{"target": "t", "fingerprint": "f", "status": "ok", "nope": 1}])
    with pytest.raises(SchemaError, match="status"):
        SCHEMA.frame([{"target": "t", "fingerprint": "f", "status": "great"}])
    with pytest.raises(SchemaError, match="lacks"):
        SCHEMA.frame([{"target": "t", "status": "ok"}])


def test_schema_round_trip_keeps_ints(tmp_path):
    path = tmp_path / "x.csv"
    SCHEMA.write(
        [
            {"target": "t", "fingerprint": "f", "status": "ok", "op": "gelu", "size": 3},
            {"target": "t", "fingerprint": "f", "status": "skipped", "reason": "no GPU", "op": "gelu"},
        ],
        path,
    )
    df = SCHEMA.read(path)
    assert list(df.columns) == SCHEMA.names
    assert "3," in path.read_text() and "3.0" not in path.read_text()
    assert math.isnan(df["median_ms"].iloc[0])


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "a.txt"
    write_atomic(target, "ok")
    assert target.read_text() == "ok"
    assert oct(os.stat(target).st_mode & 0o777) != "0o600"
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "b.txt", 42)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_measure_caps_wall_time_once_min_reps_are_done(monkeypatch):
    import gpulab.core.timing as timing_module

    clock = install(monkeypatch, timing_module)
    rng = np.random.default_rng(1)
    settings = TimingSettings(min_time_s=10.0, min_reps=5, max_reps=1000, max_wall_s=0.05, flush_cache=False)
    start = clock.now
    timing = measure(lambda: clock.advance(0.002 * rng.lognormal(0, 0.2)), settings)
    assert timing.reps >= 5 and timing.stop_reason in ("cap", "precision")
    assert clock.now - start < 0.2  # the warm-up, the pilot and the blocks up to the 0.05 s cap


# ------------------------------------------------------------------------------ stability and machine state


def test_the_stability_rule():
    assert is_stable(1.0, 1.0, 0.05, 10)
    assert not is_stable(1.11, 1.0, 0.05, 10)  # mean/median above 1.10: a stall in some repetitions
    assert not is_stable(1.0, 1.0, 0.11, 10)  # cv above 0.10
    assert not is_stable(1.0, 1.0, 0.0, 4)  # fewer than 5 repetitions: too few to judge
    assert is_stable(1.10, 1.0, 0.10, 5)


def test_measure_flags_a_stalled_repetition_and_keeps_every_time(monkeypatch):
    """A fake clock (each call advances it by a set time): the OS's sleep jitter on a loaded CI machine
    once made the steady case unstable (one 3.1 ms sleep among 2.08 ms ones)."""
    import types

    import gpulab.core.timing as timing_module

    clock = [0.0]
    monkeypatch.setattr(timing_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0],
                                                                      sleep=lambda s: None))

    def takes(durations_s):
        calls = []

        def fn():
            calls.append(1)
            clock[0] += durations_s(len(calls))
        return fn

    settings = TimingSettings(min_time_s=0.001, min_reps=10, max_reps=10, warmup_reps=1, flush_cache=False)
    timing = measure(takes(lambda n: 0.05 if n == 6 else 0.001), settings)
    times = parse_times(timing.times_ms)
    assert len(times) == timing.reps == 10 and times.max() > 40
    assert not timing.stable and timing.mean_ms / timing.median_ms > 1.10
    steady = measure(takes(lambda n: 0.002), settings)
    assert steady.cv < 0.10 and steady.stable


def test_measure_hands_back_the_output_of_the_last_timed_call():
    from gpulab.core.device import detect as measure_device

    outputs = iter(range(1000))
    settings = TimingSettings(min_time_s=0.001, min_reps=5, max_reps=5, warmup_reps=2, flush_cache=False)
    measurement = Measurement(lambda: next(outputs), settings, measure_device())
    while not measurement.done:
        measurement.step()
    timing = measurement.timing()
    last = [measurement.last]
    assert last == [(0, timing.warmup_reps + timing.reps - 1)]  # the untimed calls, then the timed ones


def test_nvidia_state_is_parsed_and_power_capping_counts_as_throttling():
    idle = {"available": True, **parse_nvidia_state((ENV_FIXTURES / "nvidia_smi_state_h100.csv").read_text())}
    capped = {"available": True,
              **parse_nvidia_state((ENV_FIXTURES / "nvidia_smi_state_h100_throttled.csv").read_text())}
    assert idle == {"available": True, "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "temp_c": 41.0,
                    "power_w": 118.2, "throttle": ""}
    assert capped["throttle"] == "sw_power_cap"
    assert throttled(idle, idle) == "no" and throttled(idle, capped) == "yes: sw_power_cap"
    with pytest.raises(ValueError, match="fields"):
        parse_nvidia_state("1980, 2619\n")


def test_rocm_state_is_parsed_from_the_tools_json_layout():
    state = parse_rocm_state((ENV_FIXTURES / "rocm_smi_state_mi300x.json").read_text())
    assert state == {"sm_clock_mhz": 2100.0, "mem_clock_mhz": 1300.0, "temp_c": 52.0, "power_w": 431.0,
                     "throttle": None}
    ok = {"available": True, **state}
    assert throttled(ok, ok) == "unknown: the tool reports no throttle reasons"
    with pytest.raises(ValueError, match="no AMD GPU"):
        parse_rocm_state((ENV_FIXTURES / "rocm_smi_no_gpu.stdout").read_text())


class _FakeNvml:
    """pynvml's calls that the state reader makes, answering what the throttled H100 fixture's line says."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 47

    def nvmlDeviceGetPowerUsage(self, handle):
        return 512340  # milliwatts

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return 0x4


def test_nvml_gives_the_state_nvidia_smi_prints_and_is_asked_first(monkeypatch):
    import gpulab.core.smi as smi

    from_tool = parse_nvidia_state((ENV_FIXTURES / "nvidia_smi_state_h100_throttled.csv").read_text())
    assert smi.nvml_state(_FakeNvml(), "handle") == from_tool
    monkeypatch.setattr(smi, "_nvml", lambda: (_FakeNvml(), "handle"))
    monkeypatch.setenv("PATH", "/nonexistent")  # nvidia-smi is not asked
    assert gpu_state("cuda") == {"available": True, **from_tool}
    broken = _FakeNvml()
    broken.nvmlDeviceGetTemperature = lambda handle, sensor: 1 / 0
    monkeypatch.setattr(smi, "_nvml", lambda: (broken, "handle"))
    assert "nvidia-smi not found" in gpu_state("cuda")["reason"]  # a field NVML lacks: the tool is asked


def test_absent_gpu_or_tool_is_recorded_not_raised(monkeypatch):
    import gpulab.core.smi as smi

    assert gpu_state("cpu") == {"available": False, "reason": "no GPU (cpu backend)"}
    monkeypatch.setattr(smi, "_nvml", lambda: None)
    monkeypatch.setenv("PATH", "/nonexistent")
    state = gpu_state("cuda")
    assert not state["available"] and "nvidia-smi not found" in state["reason"]
    assert throttled(state, state).startswith("unknown: nvidia-smi")


def test_auto_minimum_time_is_shorter_on_a_gpu_whose_repetitions_agree():
    from gpulab.core.device import DeviceInfo
    from gpulab.core.timing import CPU_MIN_TIME_S, GPU_MIN_TIME_S

    gpu = DeviceInfo(backend="cuda", torch_version="2", hip_version=None, cuda_version="13.0", gpu_available=True)
    cpu = DeviceInfo(backend="cpu", torch_version="2", hip_version=None, cuda_version=None, gpu_available=False)
    assert TimingSettings().for_device(gpu).min_time_s == GPU_MIN_TIME_S < CPU_MIN_TIME_S
    assert TimingSettings().for_device(cpu).min_time_s == CPU_MIN_TIME_S
    assert TimingSettings(min_time_s=0.5).for_device(gpu).min_time_s == 0.5  # a configured value is kept


ROCM_FIXTURES = Path(__file__).parent / "fixtures" / "rocm"
MIB = 2**20


@pytest.mark.parametrize(("backend", "l2", "memory", "rocminfo", "mib"), [
    ("cuda", 50 * MIB, 80 * 2**30, None, 100),  # an H100: torch reports its 50 MiB L2
    ("cuda", 60 * MIB, 141 * 2**30, None, 120),  # an H200: 60 MiB of L2
    ("rocm", 4 * MIB, 192 * 2**30, "rocminfo_mi300x_agent.txt", 512),  # MI300X: its 256 MiB Infinity Cache counts
    ("rocm", 2 * MIB, 64 * 2**30, "rocminfo_gfx1151_agent.txt", 64),  # Radeon 8060S: 32 MiB of L3 over 2 MiB of L2
    ("cuda", 50 * MIB, 1 * 2**30, None, 64),  # a small board: a sixteenth of its memory at most
    ("cuda", 0, 80 * 2**30, None, 512),  # no cache size reported: more than any GPU's
])
def test_the_flush_reads_twice_the_last_level_cache_the_device_reports(monkeypatch, backend, l2, memory, rocminfo,
                                                                        mib):
    import gpulab.core.device as device

    text = (ROCM_FIXTURES / rocminfo).read_text() if rocminfo else ""
    monkeypatch.setattr(device, "_rocminfo_text", lambda: text)
    info = DeviceInfo(backend=backend, torch_version="t", hip_version="7.0" if backend == "rocm" else None,
                      cuda_version="13.0" if backend == "cuda" else None, gpu_available=True,
                      arch="gfx942" if rocminfo and "mi300x" in rocminfo else "gfx1151" if rocminfo else "sm_90",
                      l2_cache_bytes=l2, total_memory_bytes=memory)
    assert flush_bytes(info) == mib * MIB
    cache = device.last_level_cache_bytes(info)
    if cache:  # a case whose own tensors exceed four times the cache is not flushed
        assert flush_bytes(info, footprint_bytes=4 * cache) > 0 and flush_bytes(info, 4 * cache + 1) == 0


def _sysfs(root: Path, levels: list[tuple[int, str, str]]) -> Path:
    for i, (level, kind, size) in enumerate(levels):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    return root


def test_a_cpu_flush_is_twice_its_highest_cache_level(tmp_path, monkeypatch):
    """The sysfs cache entries of CPU 0 as this 2-core build machine (an AMD EPYC VM) lists them: L1d 48K, L1i 32K,
    L2 1024K, L3 32768K; and a CPU whose last level is its L2."""
    import gpulab.core.device as device

    epyc = _sysfs(tmp_path / "epyc", [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                      (3, "Unified", "32768K")])
    assert device.cpu_llc_bytes(epyc) == 32 * MIB
    assert device.cpu_llc_bytes(_sysfs(tmp_path / "l2", [(1, "Data", "32K"), (2, "Unified", "2048K")])) == 2 * MIB
    assert device.cpu_llc_bytes(tmp_path / "absent") == 0
    cpu = DeviceInfo(backend="cpu", torch_version="t", hip_version=None, cuda_version=None, gpu_available=False)
    monkeypatch.setattr(device, "cpu_llc_bytes", lambda: 32 * MIB)
    assert flush_bytes(cpu) == 64 * MIB
    monkeypatch.setattr(device, "cpu_llc_bytes", lambda: 0)
    assert flush_bytes(cpu) == CPU_FLUSH_BYTES


def test_each_row_records_its_flush(monkeypatch):
    """A small case reads the flush before each repetition and says how much; one whose own tensors exceed four
    times the cache reads none."""
    import gpulab.core.device as device

    monkeypatch.setattr(device, "cpu_llc_bytes", lambda: MIB)
    cpu = DeviceInfo(backend="cpu", torch_version="t", hip_version=None, cuda_version=None, gpu_available=False)
    settings = TimingSettings(min_time_s=0.001, min_reps=4, max_reps=4, warmup_reps=1)
    small = measure(lambda: None, settings, cpu, footprint_bytes=MIB)
    large = measure(lambda: None, settings, cpu, footprint_bytes=5 * MIB)
    assert (small.flush_bytes, small.cache_policy) == (2 * MIB, "flush")
    assert (large.flush_bytes, large.cache_policy) == (0, "none")


def test_the_standalone_program_flushes_what_the_harness_flushes():
    """The HIP/CUDA program is given the same flush as the harness's rows on that device: an H200's 60 MiB L2
    gives 120 MiB, and none where flushing is switched off."""
    from gpulab.native.hip_standalone import program_args

    h200 = DeviceInfo(backend="cuda", torch_version="t", hip_version=None, cuda_version="13.0", gpu_available=True,
                      arch="sm_90", l2_cache_bytes=60 * MIB, total_memory_bytes=140 * 2**30)
    on = TimingSettings(min_time_s=0.1, min_reps=10, max_reps=100, warmup_reps=3)
    args = program_args([1024], on, h200)
    assert args[args.index("--flush-mib") + 1] == "120"
    off = program_args([1024], TimingSettings(min_time_s=0.1, min_reps=10, max_reps=100, warmup_reps=3,
                                              flush_cache=False), h200)
    assert off[off.index("--flush-mib") + 1] == "0"
