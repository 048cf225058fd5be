"""``gpulab compare``: the per-cell verdict (bootstrap CI of the ratio of medians and a minimum effect), "no
verdict" below 5 repetitions, ``--fail-on regression``, and an A/A pair of real CPU runs that must flag at
most 5% of its cells."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gpulab.bench.registry import REGISTRY, BenchContext, Registry
from gpulab.bench.runner import BENCH, run_cell
from gpulab.cli import main as gpulab_main
from gpulab.core.device import DeviceInfo
from gpulab.core.timing import TimingSettings, format_blocks, format_times
from gpulab.report.compare import (
    FASTER,
    NO_VERDICT,
    ONLY_A,
    ONLY_B,
    SLOWER,
    STATUS_CHANGED,
    WITHIN,
    bootstrap_ratio_ci,
    compare_runs,
    regressions,
    run_deltas,
    times_verdict,
)
from gpulab.report.results import ResultsIndex

CPU = DeviceInfo(backend="cpu", torch_version=torch.__version__, hip_version=None, cuda_version=None,
                 gpu_available=False, reason="PyTorch is a CPU-only build")


def _noisy(median: float, n: int = 30, seed: int = 0, spread: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return median * (1 + spread * rng.standard_normal(n))


def test_a_clear_change_is_flagged_in_its_direction():
    base = _noisy(1.0)
    assert times_verdict(base, _noisy(1.10, seed=1)).verdict == SLOWER
    assert times_verdict(base, _noisy(0.90, seed=1)).verdict == FASTER


def test_a_significant_change_below_the_minimum_effect_is_not_flagged():
    base = _noisy(1.0, n=400, spread=0.002)
    small = _noisy(1.02, n=400, seed=1, spread=0.002)
    verdict = times_verdict(base, small)
    assert verdict.ci_low > 1  # statistically certain...
    assert verdict.verdict == WITHIN  # ...but 2% is below the 3% default
    assert times_verdict(base, small, min_effect=0.01).verdict == SLOWER


def test_noise_wider_than_the_change_is_not_flagged():
    assert times_verdict(_noisy(1.0, spread=0.3), _noisy(1.05, seed=1, spread=0.3)).verdict == WITHIN


def test_fewer_than_five_repetitions_give_no_verdict_and_say_so():
    verdict = times_verdict(np.array([1.0]), _noisy(2.0))
    assert verdict.verdict == NO_VERDICT and "fewer than 5 repetitions (1 vs 30)" in verdict.note
    assert times_verdict(_noisy(1.0, n=4), _noisy(1.0, n=5)).verdict == NO_VERDICT


def test_the_bootstrap_interval_covers_the_ratio_of_medians():
    a, b = _noisy(1.0, n=200), _noisy(1.5, n=200, seed=2)
    low, high = bootstrap_ratio_ci(a, b)
    assert low < np.median(b) / np.median(a) < high and high - low < 0.05


def _row(impl: str, median: float, status: str = "ok", n: int = 30, seed: int = 0) -> dict:
    times = _noisy(median, n=n, seed=seed)
    return {"target": "t", "op": "gelu", "dtype": "fp32", "size": 1024, "impl": impl, "status": status,
            "median_ms": float(np.median(times)), "p10_ms": float(np.percentile(times, 10)),
            "p90_ms": float(np.percentile(times, 90)), "cv": 0.02, "reps": n, "times_ms": format_times(times)}


def test_run_deltas_match_cells_and_flag_status_changes_and_missing_cells():
    a = pd.DataFrame([_row("native", 1.0), _row("triton", 1.0), _row("manual", 2.0), _row("cpp_ext", 1.0),
                      _row("study", 1.0, n=1)])
    b = pd.DataFrame([_row("native", 1.5, seed=1), _row("triton", 1.0, "incorrect", seed=1),
                      _row("manual", 2.0, seed=1), _row("torch_compile", 1.0), _row("study", 3.0, n=1)])
    deltas = run_deltas(a, b).set_index("impl")
    assert deltas.loc["native", "verdict"] == SLOWER
    assert deltas.loc["native", "change_pct"] == pytest.approx(50.0, abs=3)
    assert deltas.loc["triton", "verdict"] == STATUS_CHANGED and deltas.loc["triton", "note"] == "ok → incorrect"
    assert deltas.loc["manual", "verdict"] == WITHIN
    assert deltas.loc["study", "verdict"] == NO_VERDICT  # one timing each: a tripling is not evidence
    assert deltas.loc["cpp_ext", "verdict"] == ONLY_A and deltas.loc["torch_compile", "verdict"] == ONLY_B
    # Flagged cells come first: a reviewer reads regressions before noise.
    assert list(run_deltas(a, b)["verdict"])[:2] == [SLOWER, STATUS_CHANGED]
    assert set(regressions(run_deltas(a, b))["impl"]) == {"native", "triton"}


def _paired(impl: str, case_ms: float, reference_ms: float, seed: int) -> dict:
    """A row timed in 8 blocks, each beside a block of the reference; the case's blocks wander with the machine
    (each block's state scales both), the reference's too."""
    rng = np.random.default_rng(seed)
    states = 1 + 0.05 * rng.standard_normal(8)
    case = [case_ms * s * (1 + 0.01 * rng.standard_normal(10)) for s in states]
    reference = [reference_ms * s * (1 + 0.01 * rng.standard_normal(10)) for s in states]
    return {**_row(impl, case_ms), "times_ms": format_blocks(case), "reference_times_ms": format_blocks(reference),
            "reference_method": "memcpy"}


def test_a_change_stands_only_where_the_time_relative_to_the_reference_beside_it_changed_too():
    a = pd.DataFrame([_paired(impl, 1.0, 0.5, seed) for seed, impl in enumerate(("machine", "kernel", "noise"))])
    b = pd.DataFrame([_paired("machine", 0.6, 0.3, 10),  # the whole machine 40% faster: case and reference
                      _paired("kernel", 1.5, 0.5, 11),  # the kernel 50% slower, the reference as it was
                      _paired("noise", 1.0, 0.3, 12)])  # only the reference moved
    deltas = run_deltas(a, b).set_index("impl")
    kernel = deltas.loc["kernel"]
    assert kernel["verdict"] == SLOWER and kernel["change_pct"] == pytest.approx(50, abs=8), kernel["note"]
    assert kernel["note"] == "relative to memcpy: slower" and kernel["relative_change_pct"] == pytest.approx(50, abs=8)
    machine = deltas.loc["machine"]
    assert machine["verdict"] == WITHIN and machine["change_pct"] == pytest.approx(-40, abs=8), machine["note"]
    assert machine["note"] == "relative to memcpy: no significant change"
    assert machine["reference_change_pct"] == pytest.approx(-40, abs=8) and abs(machine["relative_change_pct"]) < 8
    assert deltas.loc["noise", "verdict"] == WITHIN
    # Without the reference the machine's change is judged on the time alone, and flagged.
    bare = run_deltas(a.drop(columns="reference_times_ms"), b.drop(columns="reference_times_ms")).set_index("impl")
    assert bare.loc["machine", "verdict"] == FASTER and bare.loc["machine", "note"] == ""
    assert "relative_change_pct" not in bare.columns


def test_rows_with_only_tokens_per_second_compare_on_per_token_time():
    a = pd.DataFrame([{"target": "t", "model": "m", "engine": "hf", "status": "ok", "tok_s": 100.0}])
    b = a.assign(tok_s=50.0)
    row = run_deltas(a, b).iloc[0]
    assert row["change_pct"] == pytest.approx(100.0) and row["verdict"] == NO_VERDICT


# The A/A test's hypothesis: a false-flag rate of at most 5%, rejected at 3%.
A_A_RATE, A_A_ALPHA = 0.05, 0.03


def _binomial_bound(n: int, rate: float, alpha: float) -> int:
    """The fewest flags k such that more than k of n flagged has probability at most alpha at this rate."""
    tail = 1.0
    for k in range(n + 1):
        tail -= math.comb(n, k) * rate**k * (1 - rate) ** (n - k)
        if tail <= alpha:
            return k
    return n


MATRIX = (("gelu", [(1 << 14,), (1 << 17,)]), ("add", [(1 << 14,), (1 << 17,)]), ("softmax", [(64, 256), (256, 512)]))


def _repeating(repeat: int) -> Registry:
    """The registered implementations of the matrix's ops, each running the op ``repeat`` times per call: the
    same kernel made slower, as an edit could, with its result unchanged."""
    slowed = Registry()
    for op, _ in MATRIX:
        for name in REGISTRY.impls(op):
            impl = REGISTRY.get(op, name)

            def factory(case, inputs, out, inner=impl.factory):
                call = inner(case, inputs, out)

                def repeated():
                    for _ in range(repeat - 1):
                        call()
                    return call()

                return repeated

            slowed.register(op, name, writes_out=impl.writes_out, availability=impl.availability)(factory)
    return slowed


PAIR_SETTINGS = TimingSettings(min_time_s=0.05, min_reps=30, max_reps=200, max_wall_s=1.0, warmup_reps=3,
                               flush_cache=False)  # min_span_s and reference: auto, the defaults of a CPU run


def _runs(first: Path, second: Path, matrix=MATRIX, impls=("native", "manual"), repeat: int = 1) -> None:
    """Two real CPU runs of a small benchmark matrix, written as two results directories; in the second run
    each implementation runs its op ``repeat`` times per call (a real slowdown when above 1).

    Each run measures each (op, implementation) cell as the workflow's bench job does (``run_cell``: all
    sizes x dtypes together, their blocks taken in turn); the two runs alternate cell by cell, so both
    meet the same machine, and one torch thread keeps the cores from being oversubscribed.
    """
    registries = {first: REGISTRY, second: _repeating(repeat) if repeat > 1 else REGISTRY}
    ctx = BenchContext(CPU, "local")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for op, shapes in matrix:
            rows: dict[Path, list] = {first: [], second: []}
            for impl in impls:
                for root, registry in registries.items():
                    found = run_cell(op, impl, shapes=shapes, dtypes=["fp32", "bf16"], settings=PAIR_SETTINGS,
                                     ctx=ctx, fingerprint="aa", registry=registry, progress=False)
                    labels = ["x".join(map(str, s)) if len(s) > 1 else s[0] for s in shapes for _ in range(2)]
                    rows[root] += [{**row, "size": label} for row, label in zip(found, labels, strict=True)]
            for root, found in rows.items():
                BENCH.write(found, root / "local" / "bench" / f"{op}.csv")
    finally:
        torch.set_num_threads(threads)
    for root in (first, second):
        (root / "local" / "env").mkdir(parents=True, exist_ok=True)
        (root / "local" / "env" / "env.json").write_text(json.dumps({"fingerprint": "aa", "device": {"name": "cpu"}}))


# A shared machine's states can outlast a cell, so a failing pair is taken once more (the A/A runs: docs/decisions.md).
A_A_ATTEMPTS = 2


def _failed_attempts(root: Path, take: Callable[[Path], pd.DataFrame],
                     passes: Callable[[pd.DataFrame], bool]) -> list[pd.DataFrame]:
    """Pairs taken under ``root`` by ``take`` until one passes, at most A_A_ATTEMPTS: every pair's table when none
    did, else nothing."""
    seen = []
    for attempt in range(A_A_ATTEMPTS):
        seen.append(take(root / f"attempt{attempt}"))
        if passes(seen[-1]):
            return []
    return seen


def _a_a_flags(root: Path) -> pd.DataFrame:
    first, second = root / "a", root / "b"
    _runs(first, second)
    deltas = compare_runs(ResultsIndex(first), ResultsIndex(second))
    judged = deltas[deltas["verdict"].isin([SLOWER, FASTER, WITHIN])]
    assert len(judged) == 24 and len(deltas) == 24, deltas["verdict"].value_counts()
    return deltas[deltas["verdict"].isin([SLOWER, FASTER, STATUS_CHANGED])]


@pytest.mark.slow
def test_an_a_a_pair_of_real_runs_flags_at_most_five_percent_of_cells(tmp_path):
    """The flagged count must be consistent with a false-flag rate of at most 5%: one-sided binomial test at
    3% (more than 3 of 24 flagged has probability 0.03 at a 5% rate). A per-run bound of 1 of 24 would fail a
    method whose rate is exactly 5% a third of the time; 5 of 24, the best the case-by-case timing did, fails.

    A pair that fails is taken again once, and one of the two must pass: a disturbed machine (9 of 24 once
    in five CI runs) then fails the test only if it is disturbed twice, while a method flagging a third of
    the cells, as the case-by-case timing did, still fails both pairs nineteen times in twenty."""
    allowed = _binomial_bound(24, A_A_RATE, A_A_ALPHA)
    assert allowed == 3
    seen = _failed_attempts(tmp_path, _a_a_flags, lambda flagged: len(flagged) <= allowed)
    if seen:
        pytest.fail(f"A/A pairs flagged {[len(f) for f in seen]} of 24 cells (at most {allowed} allowed):\n"
                    + "\n".join(f[["artifact", "impl", "size", "dtype", "change_pct"]].to_string() for f in seen))


def _twice_as_slow(root: Path) -> pd.DataFrame:
    first, second = root / "a", root / "b"
    _runs(first, second, matrix=(("gelu", [(1 << 17,)]), ("add", [(1 << 17,)])), repeat=2)
    deltas = compare_runs(ResultsIndex(first), ResultsIndex(second))
    assert len(deltas) == 8 and deltas["verdict"].isin([SLOWER, WITHIN]).all(), deltas
    assert deltas["note"].str.match("relative to (?:memcpy|torch.add): ").all(), deltas["note"]  # every case paired
    return deltas


# Twice the work per call: a slowdown far beyond the state shifts a shared machine's intervals hold.
@pytest.mark.slow
def test_a_kernel_made_twice_as_slow_is_flagged(tmp_path):
    """The power side of the A/A test: the same cases, each running its op twice per call, are slower. A change is
    flagged only where the time relative to the reference timed beside it changed too, and on a shared 2-core CPU
    that reference (a copy or add over rotated buffers the last-level cache may or may not hold) shifts by up to
    ±40% from block to block, where the case shifts by about 10%: a 20 µs fp32 add or copy then misses the
    doubling in up to two cells of eight, in a third of the pairs on an idle machine and in most beside a busy
    process (docs/decisions.md, "Timing on a shared CPU"). So two cells may miss; none may come out faster. A
    method without the power flags about none of eight, as the A/A test's false flags; a pair that misses more is
    taken again once, as the A/A test's is."""
    seen = _failed_attempts(tmp_path, _twice_as_slow, lambda deltas: (deltas["verdict"] == SLOWER).sum() >= 6)
    if seen:
        pytest.fail("a twice-as-slow kernel was missed in more than two cells of eight, twice:\n"
                    + "\n".join(f[["impl", "dtype", "change_pct", "verdict", "note"]].to_string() for f in seen))


def test_fail_on_regression_exits_non_zero_on_a_significant_slowdown(tmp_path, capsys):
    base = tmp_path / "base" / "local"
    (base / "bench").mkdir(parents=True)
    (base / "env").mkdir()
    (base / "env" / "env.json").write_text(json.dumps({"fingerprint": "x", "device": {"name": "cpu"}}))
    rows = [{**_row("native", 1.0), "target": "local", "fingerprint": "x", "reason": ""}]
    BENCH.write(rows, base / "bench" / "gelu.csv")
    new = tmp_path / "new" / "local"
    shutil.copytree(base, new)
    out = tmp_path / "c.html"
    args = ["compare", str(base.parent), str(new.parent), "-o", str(out), "--fail-on", "regression"]
    assert gpulab_main(args) == 0
    BENCH.write([{**rows[0], **_row("native", 1.2, seed=3), "target": "local"}], new / "bench" / "gelu.csv")
    assert gpulab_main(args) == 1
    assert "regression" in capsys.readouterr().err
    assert gpulab_main([*args, "--min-effect", "30"]) == 0  # a 20% slowdown is below a 30% minimum effect
    assert gpulab_main(args[:-2]) == 0  # without --fail-on the comparison only reports
