"""The stopping rule: a measurement takes blocks until the median is known to its target (rel_ci), between a floor
and a cap, and says why it stopped. Every timer here is a fake clock driven by the closures."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fake_clock import install

import gpulab.core.timing as timing_module
from gpulab.core import energy
from gpulab.core.device import DeviceInfo
from gpulab.core.timing import MIN_BLOCKS, TimingSettings, judge, measure, median_ci, parse_blocks

CPU = DeviceInfo(backend="cpu", torch_version="2", hip_version=None, cuda_version=None, gpu_available=False)
GPU = DeviceInfo(backend="cuda", torch_version="2", hip_version=None, cuda_version="13.0", gpu_available=True)
SETTINGS = TimingSettings(min_time_s=0.4, min_reps=10, max_reps=1000, max_wall_s=100.0, warmup_reps=1,
                          flush_cache=False, blocks=8)


@pytest.fixture
def clock(monkeypatch):
    return install(monkeypatch, timing_module, energy)


def timer(clock, durations_s):
    """A closure whose n-th call takes ``durations_s(n)`` seconds of the fake clock."""
    count = itertools.count()

    def call() -> None:
        clock.advance(durations_s(next(count)))
    return call


def test_the_median_interval_is_the_order_statistics_around_the_middle():
    x = np.arange(1.0, 21.0)  # n = 20: ranks 5 and 16 bound the 95% interval of the median (10.5)
    assert median_ci(x) == pytest.approx((16 - 5) / 2 / 10.5)
    assert median_ci(np.full(50, 2.0)) == 0.0
    assert median_ci(np.arange(1.0, 10.0)) == pytest.approx((9 - 1) / 2 / 5)  # n <= 10: the whole range
    assert math.isnan(median_ci([1.0]))


def test_a_quiet_timer_stops_on_precision_at_the_floor(clock):
    """Repetitions that agree to 0.01%: the floor (two blocks, at least min_reps) already gives the figure."""
    quiet = measure(timer(clock, lambda n: 0.002 * (1 + 1e-4 * (n % 3))), SETTINGS, CPU)
    assert quiet.stop_reason == "precision" and quiet.rel_ci <= SETTINGS.rel_ci_bandwidth
    assert len(parse_blocks(quiet.times_ms)) == MIN_BLOCKS and quiet.reps >= SETTINGS.min_reps
    assert quiet.reps == 2 * 25  # blocks sized from the pilot: min_time_s / blocks of 2 ms calls


def test_a_noisy_timer_whose_noise_has_settled_stops_before_the_cap(clock):
    """Every block the same spread of ±20%: four blocks say the noise no longer moves, and the cap's repetitions
    could not bring the interval to 0.5%, so the measurement stops there rather than run to its cap."""
    pattern = [0.8, 1.2, 0.9, 1.1, 1.0, 0.85, 1.15, 0.95, 1.05, 1.0]
    noisy = measure(timer(clock, lambda n: 0.002 * pattern[n % len(pattern)]), SETTINGS, CPU)
    assert noisy.stop_reason == "noise settled" and noisy.rel_ci > SETTINGS.rel_ci_bandwidth
    assert len(parse_blocks(noisy.times_ms)) == timing_module.NOISE_MIN_BLOCKS


def drifting(clock, seconds: float, block: int):
    """A closure whose spread widens every ``block`` calls, evenly spread within (a golden-ratio sequence)."""
    calls = itertools.count()

    def call() -> None:
        n = next(calls)
        clock.advance(seconds * (1 + 0.02 * (1 + n // block) * (2 * (n * 0.618034 % 1) - 1)))
    return call


def test_a_drifting_timer_runs_to_its_cap(clock):
    """A device whose spread keeps growing block after block never settles: all eight blocks are taken."""
    capped = measure(drifting(clock, 0.002, 25), SETTINGS, CPU)
    assert capped.stop_reason == "cap" and len(parse_blocks(capped.times_ms)) == SETTINGS.blocks


def test_the_wall_time_and_repetition_caps_stop_a_noisy_timer(clock):
    """Past the floor, a measurement stops once its own blocks took max_wall_s, or at max_reps."""
    slow = measure(drifting(clock, 0.05, 2), TimingSettings(min_time_s=8.0, min_reps=10, max_wall_s=0.65,
                                                             flush_cache=False), CPU)
    blocks = parse_blocks(slow.times_ms)
    assert slow.stop_reason == "cap" and len(blocks) < 8 and sum(map(sum, blocks[:-1])) < 650 <= sum(map(sum, blocks))
    rng = np.random.default_rng(5)
    few = measure(timer(clock, lambda n: 0.001 * rng.lognormal(0, 0.3)),
                  TimingSettings(min_time_s=1.0, min_reps=10, max_reps=12, flush_cache=False), CPU)
    assert few.stop_reason == "cap" and few.reps == 12


def test_a_latency_bound_call_stops_at_the_looser_target(clock):
    """A 5 µs call on a GPU is latency-bound: it stops once its interval is within 2%, a figure that would keep
    a bandwidth-bound call going."""
    settings = TimingSettings().for_device(GPU)
    assert settings.target(0.005) == settings.rel_ci_latency == 0.02
    assert settings.target(0.5) == settings.rel_ci_bandwidth == 0.005
    blocks = [[1.0, 1.02, 0.99, 1.01, 0.98] * 4] * 2
    rel_ci, reason = judge(blocks, 0.02, min_reps=10, max_reps=1000, max_blocks=8, wall_s=0.0, max_wall_s=3.0,
                           cap_reps=320)
    assert 0.005 < rel_ci <= 0.02 and reason == "precision"
    assert judge(blocks, 0.005, min_reps=10, max_reps=1000, max_blocks=8, wall_s=0.0, max_wall_s=3.0,
                 cap_reps=320)[1] == ""


def test_the_floor_holds_even_when_the_first_block_is_exact():
    one = [[1.0] * 50]
    assert judge(one, 0.005, min_reps=10, max_reps=1000, max_blocks=8, wall_s=0.0, max_wall_s=3.0,
                 cap_reps=400)[1] == ""
    assert judge([[1.0] * 4] * 2, 0.005, min_reps=10, max_reps=1000, max_blocks=8, wall_s=0.0, max_wall_s=3.0,
                 cap_reps=400)[1] == ""  # two blocks, 8 repetitions: under min_reps
    assert judge([[1.0] * 5] * 2, 0.005, min_reps=10, max_reps=1000, max_blocks=8, wall_s=0.0, max_wall_s=3.0,
                 cap_reps=400)[1] == "precision"


def test_a_fixed_count_says_so_and_still_records_its_interval(clock):
    fixed = measure(timer(clock, lambda n: 0.003), TimingSettings(min_reps=3, max_reps=3, flush_cache=False), CPU)
    assert fixed.reps == 3 and fixed.stop_reason == "count" and fixed.rel_ci == 0.0
