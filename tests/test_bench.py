"""Benchmark matrices: the registry, the one op definition and correctness gate, the statistics, the
per-pattern ceilings and their invariant, size scaling, outcomes, aggregation and the report section
(on the recorded runs in tests/fixtures/bench)."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch
from fake_clock import install

from gpulab.bench import impls
from gpulab.bench.correctness import THRESHOLDS, tolerance_for
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Registry, Unavailable
from gpulab.bench.runner import BENCH, ENERGY_AT_LARGEST, aggregate, run_case, run_cell
from gpulab.bench.sizes import (
    ODD_ELEMENTS,
    ODD_ROWS,
    STUDY_GELU_ELEMENTS,
    TARGET_SOFTMAX,
    auto_sizes,
    matrix_tensor_bytes,
    resolve_sizes,
)
from gpulab.core.ceilings import (
    CEILINGS,
    INDUCTOR,
    LATENCY_FRACTION,
    RAISE_LIMIT,
    SCREEN_REPS,
    Ceilings,
    Hit,
    above_ceiling,
    ceiling_sizes,
    mark_best,
    measure_ceilings,
    measure_pattern,
    pattern_methods,
    pct_of,
    placement,
    plateau_bytes,
    raised_rows,
    regime,
    screen_sweep,
    share_ceilings,
)
from gpulab.core.device import GPU_CAP_BYTES, DeviceInfo, max_tensor_bytes
from gpulab.core.ops import (
    ELEMENT_TOLERANCES,
    OPS,
    by_ext_op,
    check,
    compare,
    manual_gelu,
    op_spec,
    parse_shape,
)
from gpulab.core.tables import SchemaError
from gpulab.core.timing import TimingSettings, parse_times, rotation_sets, summarize

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
FAST = TimingSettings(min_time_s=0.005, min_reps=3, max_reps=20, warmup_reps=1, flush_cache=False, min_span_s=0,
                      reference=False)
CPU = DeviceInfo(backend="cpu", torch_version=torch.__version__, hip_version=None, cuda_version=None,
                 gpu_available=False, reason="PyTorch is a CPU-only build")
GIB = 2**30


def gpu(memory_gib: float) -> DeviceInfo:
    return DeviceInfo(backend="cuda", torch_version="2.11", hip_version=None, cuda_version="13.0", gpu_available=True,
                      name="test GPU", arch="sm_90", total_memory_bytes=int(memory_gib * GIB), warp_size=32,
                      l2_cache_bytes=50 * 2**20)


def ctx() -> BenchContext:
    return BenchContext(CPU, "test")


# ------------------------------------------------------------------------------ registry


def test_every_op_has_the_five_implementations_and_native_is_a_fused_single_op():
    for op in OPS:
        assert set(REGISTRY.impls(op)) == {"manual", "native", "cpp_ext", "triton", "torch_compile"}
    assert REGISTRY.get("gelu", "triton").writes_out and not REGISTRY.get("gelu", "native").writes_out


def test_registry_refuses_duplicates_and_names_what_exists():
    registry = Registry()

    @registry.register("gelu", "mine")
    def mine(case, inputs, out):
        """one-liner"""
        return lambda: inputs[0]

    with pytest.raises(ValueError, match="already registered"):
        registry.register("gelu", "mine")(mine)
    with pytest.raises(KeyError, match=r"no implementation 'nope' of op 'gelu' is registered \(known: mine\)"):
        registry.get("gelu", "nope")
    assert registry.get("gelu", "mine").description == "one-liner"


def test_adding_an_implementation_is_one_function_and_it_runs_through_the_matrix():
    registry = Registry()

    @registry.register("add", "sub_of_neg")
    def sub_of_neg(case, inputs, out):
        a, b = inputs
        return lambda: torch.sub(a, -b)

    rows = run_cell("add", "sub_of_neg", shapes=[(ODD_ELEMENTS,), (4096,)], dtypes=["fp32", "bf16"], settings=FAST,
                    ctx=ctx(), fingerprint="fp", registry=registry, progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [(r["size"], r["dtype"]) for r in rows] == [("98432", "fp32"), ("98432", "bf16"), ("4096", "fp32"),
                                                       ("4096", "bf16")]
    BENCH.frame(rows)  # every column it produced is declared


# ------------------------------------------------------------------------------ correctness gate


def _gate(op: str, factory, *, writes_out: bool = False, shape=(ODD_ELEMENTS,), dtype="fp32") -> dict:
    registry = Registry()
    registry.register(op, "under_test", writes_out=writes_out)(factory)
    return run_case(Case(op, "under_test", shape, dtype, "cpu"), ctx(), FAST, registry=registry)


@pytest.mark.slow
def test_gate_passes_the_real_implementations_on_odd_sizes():
    for op, shape in (("gelu", (ODD_ELEMENTS,)), ("softmax", ODD_ROWS), ("add", (ODD_ELEMENTS,))):
        for impl in ("manual", "native"):
            for dtype in ("fp32", "fp16", "bf16"):
                row = run_case(Case(op, impl, shape, dtype, "cpu"), ctx(), FAST)
                assert row["status"] == "ok", (op, impl, dtype, row["reason"])
                assert 0 < row["rel_err"] <= THRESHOLDS[dtype] / 2, (op, impl, dtype, row["rel_err"])
                assert 0 < row["element_err_ratio"] <= 0.5, (op, impl, dtype, row["element_err_ratio"])


def test_gate_catches_a_wrong_formula_and_does_not_time_it():
    # erf GeLU instead of the tanh approximation: close (1e-4 relative), but not the op benchmarked.
    row = _gate("gelu", lambda case, inputs, out: (lambda: torch.nn.functional.gelu(inputs[0])))
    assert row["status"] == "incorrect"
    assert THRESHOLDS["fp32"] < row["rel_err"] < 1e-2
    assert "exceeds the fp32 tolerance" in row["reason"]
    assert "median_ms" not in row and "gbps" not in row


def test_gate_catches_an_unwritten_element_through_the_poisoned_output():
    def skips_last(case, inputs, out):
        def run():
            out[:-1] = manual_gelu(inputs[0][:-1])
            return out

        return run

    row = _gate("gelu", skips_last, writes_out=True)
    assert row["status"] == "incorrect"
    assert row["nonfinite"] == 1 and "1 of 98432 outputs are not finite" in row["reason"]


def test_gate_catches_a_softmax_that_drops_the_last_column_and_a_wrong_dtype():
    def no_last_column(case, inputs, out):
        x = inputs[0]
        return lambda: torch.cat([torch.softmax(x[:, :-1], dim=-1), torch.zeros_like(x[:, -1:])], dim=1)

    assert _gate("softmax", no_last_column, shape=ODD_ROWS)["status"] == "incorrect"
    row = _gate("add", lambda case, inputs, out: (lambda: (inputs[0].double() + inputs[1].double())), dtype="bf16")
    assert row["status"] == "incorrect" and "expected (98432,) torch.bfloat16" in row["reason"]


def test_gate_rejects_an_impl_that_claims_out_but_returns_a_new_tensor():
    row = _gate("add", lambda case, inputs, out: (lambda: inputs[0] + inputs[1]), writes_out=True)
    assert row["status"] == "incorrect" and "returned another tensor" in row["reason"]


def test_inputs_are_random_never_zero_and_fresh_per_seed():
    spec = op_spec("gelu")
    a = spec.make_inputs((4096,), torch.float32, "cpu", seed=1)[0]
    b = spec.make_inputs((4096,), torch.float32, "cpu", seed=2)[0]
    assert (a != 0).all() and not torch.equal(a, b)
    assert torch.equal(a, spec.make_inputs((4096,), torch.float32, "cpu", seed=1)[0])


def test_check_is_the_norm_ratio_in_float64_chunked():
    a, b = op_spec("add").make_inputs((10_000,), torch.float64, "cpu", seed=3)
    ref = a + b
    got = check("add", ref * (1 + 1e-6), [a, b], "fp32", chunk_elems=999)
    assert got.passed and got.rel_err == pytest.approx(1e-6, rel=1e-6)
    (x,) = op_spec("softmax").make_inputs((37, 101), torch.float32, "cpu", seed=4)
    got = check("softmax", torch.softmax(x.double(), -1).float(), [x], "fp32", chunk_elems=500)
    assert got.passed and got.rel_err < 1e-7 and got.max_abs_err < 1e-7 and got.nonfinite == 0


def test_the_element_bound_fails_one_wrong_element_the_norm_lets_through():
    a, b = op_spec("add").make_inputs((1 << 16,), torch.bfloat16, "cpu", seed=5)
    out = a + b
    out[123] += 0.5
    got = check("add", out, [a, b], "bf16")
    assert got.rel_err < THRESHOLDS["bf16"]  # the norm alone would pass it
    assert not got.passed and got.element_ratio > 1 and "an element is off" in got.reason


def test_a_wrong_softmax_row_fails_and_any_nan_or_inf_fails():
    (x,) = op_spec("softmax").make_inputs(ODD_ROWS, torch.bfloat16, "cpu", seed=6)
    out = torch.softmax(x, -1)
    out[7] = out[8]
    assert not check("softmax", out, [x], "bf16").passed
    for bad in (math.nan, math.inf):
        y = torch.softmax(x, -1)
        y[0, 0] = bad
        got = check("softmax", y, [x], "bf16")
        assert not got.passed and got.nonfinite == 1 and "not finite" in got.reason


def test_one_definition_per_op_reference_bytes_pattern_and_extension_name():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    assert torch.allclose(OPS["gelu"].reference(x), torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-8)
    assert OPS["gelu"].reference(x.float()).dtype == torch.float64
    assert {op: s.pattern for op, s in OPS.items()} == {"gelu": "copy", "softmax": "copy", "add": "add"}
    assert {op: s.ext_op for op, s in OPS.items()} == {"gelu": "gelu_tanh", "softmax": "softmax_rows",
                                                       "add": "vector_add"}
    assert OPS["add"].bytes_moved((1000,), 2) == 6000 and OPS["softmax"].bytes_moved((10, 10), 4) == 800
    ref = OPS["gelu"].reference(x)
    assert compare(ref.float(), ref, "fp32").passed and not compare(x.float(), ref, "fp32").passed
    assert set(ELEMENT_TOLERANCES) == set(THRESHOLDS)
    assert by_ext_op("softmax_rows") is OPS["softmax"]
    with pytest.raises(ValueError, match=r"no op is torch\.ops\.gpulab\.nope"):
        by_ext_op("nope")


def test_the_gelu_formula_is_written_once_in_python(repo):
    kappa = "0.04" + "4715"  # spelled apart so this test is not a hit itself
    hits = subprocess.run(["git", "grep", "-n", kappa, "--", "*.py"], cwd=repo, capture_output=True,
                          text=True).stdout.splitlines()
    python = [h for h in hits if not h.startswith("kernels/")]
    # kernels/triton has its own (a kernel language), as has the extension's C++ header (tests/test_build.py).
    assert [h.split(":")[0] for h in python] == ["src/gpulab/core/ops.py"]


def test_the_gate_fails_an_implementation_that_mutates_its_inputs():
    def in_place(case, inputs, out):
        return lambda: inputs[0].add_(inputs[1])

    row = _gate("add", in_place)
    assert row["status"] == "incorrect" and "changed its input 0" in row["reason"]


def test_the_gate_checks_the_output_of_the_last_timed_call():
    calls = []  # shared by the closures of every input set: only the gate's call is right

    def right_once(case, inputs, out):
        def run():
            calls.append(1)
            y = manual_gelu(inputs[0])
            return y if len(calls) == 1 else y * 1.01

        return run

    row = _gate("gelu", right_once)
    assert row["status"] == "incorrect" and row["reason"].startswith("the last timed call:")


def test_on_cpu_the_last_timed_call_with_the_gates_bits_reuses_its_check_and_still_checks_the_inputs(monkeypatch):
    """The float64 reference is computed once per case on a CPU: the last timed call returned the gate's bits
    from the gate's inputs, so the gate's figures are its own. Anything else is checked in full."""
    from gpulab.bench import correctness
    from gpulab.bench.runner import keeps_gate_output

    assert keeps_gate_output(CPU) and not keeps_gate_output(gpu(80))
    references = []
    real_check = correctness.check
    monkeypatch.setattr(correctness, "check", lambda *a, **k: references.append(1) or real_check(*a, **k))
    flushed = replace(FAST, flush_cache=True)  # one input set: the gate's
    row = run_case(Case("gelu", "native", (ODD_ELEMENTS,), "fp32", "cpu"), ctx(), flushed)
    assert row["status"] == "ok" and len(references) == 1 and row["rel_err"] < 1e-6

    calls = []  # the gate's bits every time, but a later call changes its input first

    def mutates_later(case, inputs, out):
        def run():
            calls.append(1)
            if len(calls) == 1:
                calls.append(manual_gelu(inputs[0]))
            else:
                inputs[0][0] += 1.0
            return calls[1].clone()

        return run

    registry = Registry()
    registry.register("gelu", "under_test")(mutates_later)
    row = run_case(Case("gelu", "under_test", (ODD_ELEMENTS,), "fp32", "cpu"), ctx(), flushed, registry=registry)
    assert row["status"] == "incorrect" and "changed its input 0" in row["reason"]

    references.clear()
    noisy = iter(range(10**6))  # right to within the tolerance, but other bits from the second call on

    def jitters(case, inputs, out):
        return lambda: manual_gelu(inputs[0]) * (1 + 1e-7 * min(1, next(noisy)))

    registry = Registry()
    registry.register("gelu", "under_test")(jitters)
    row = run_case(Case("gelu", "under_test", (ODD_ELEMENTS,), "fp32", "cpu"), ctx(), flushed, registry=registry)
    assert row["status"] == "ok" and len(references) == 2  # checked in full again


def test_the_timed_closure_is_the_checked_one_with_its_poisoned_out_buffer():
    made = []

    def into_out(case, inputs, out):
        made.append(out)
        return lambda: torch.add(inputs[0], inputs[1], out=out)

    registry = Registry()
    registry.register("add", "under_test", writes_out=True)(into_out)
    row = run_case(Case("add", "under_test", (4096,), "fp32", "cpu"), ctx(), replace(FAST, flush_cache=True),
                   registry=registry)
    assert row["status"] == "ok" and len(made) == 1  # one closure: checked, then timed (cache flushed: one set)
    assert not torch.isnan(made[0]).any()  # the poisoned buffer the gate checked was written


def test_tolerances_come_from_config_over_the_defaults():
    assert tolerance_for("bf16") == THRESHOLDS["bf16"]
    assert tolerance_for("bf16", {"bf16": 0.5}) == 0.5


# ------------------------------------------------------------------------------ statistics


def _ceiling_rows(gbps_by_pattern: dict[str, float], sizes=(2**18, 2**20), dtypes=("fp32", "bf16")) -> list[dict]:
    rows = []
    for kind, gbps in gbps_by_pattern.items():
        for size in sizes:
            for dtype in dtypes:
                for method, scale in (("torch", 1.0), ("other", 0.5)):
                    rows.append({"target": "test", "fingerprint": "fp", "status": "ok", "kind": kind, "dtype": dtype,
                                 "size": str(size), "tensor_bytes": size, "method": method,
                                 "gbps": gbps * scale * (2 if size > 2**18 else 1), "p10_ms": 1.0, "p90_ms": 1.1})
    return mark_best(rows)


def test_row_statistics_follow_from_bytes_moved_and_the_pattern_ceiling(tmp_path):
    CEILINGS.write(_ceiling_rows({"copy": 8.0, "add": 4.0}), tmp_path / "ceilings.csv")
    ceilings = Ceilings.load(tmp_path / "ceilings.csv")
    out = run_cell("add", "native", shapes=[(1 << 16,)], dtypes=["fp32", "bf16"], settings=FAST, ctx=ctx(),
                   fingerprint="fp", ceilings=ceilings, progress=False)
    for row in out:
        itemsize = 4 if row["dtype"] == "fp32" else 2
        assert row["bytes_moved"] == 3 * (1 << 16) * itemsize and row["pattern"] == "add"
        assert row["gbps"] == pytest.approx(row["bytes_moved"] / (row["median_ms"] / 1e3) / 1e9)
        assert row["ceiling_gbps"] == 4.0 and row["ceiling_bytes"] == 2**18 and row["ceiling_method"] == "torch"
        assert row["pct_of_ceiling"] == pytest.approx(100 * row["gbps"] / 4.0)
        assert row["gflops"] == pytest.approx((1 << 16) / (row["median_ms"] / 1e3) / 1e9)
        assert row["reps"] >= FAST.min_reps and row["timer"] == "perf_counter"
        assert row["method"].startswith("perf_counter, median of")
        assert row["cold_call_ms"] > 0 and len(parse_times(row["times_ms"])) == row["reps"]
        assert row["throttled"] == "unknown: no GPU (cpu backend)"
    BENCH.frame([{"target": "t", "fingerprint": "fp", **r} for r in out])


def test_ceiling_lookup_takes_the_best_method_at_the_nearest_size_of_the_pattern():
    ceilings = Ceilings(CEILINGS.frame(_ceiling_rows({"read": 10.0, "copy": 8.0, "add": 4.0})))
    assert ceilings.lookup("copy", "fp32", 2**18).gbps == 8.0
    assert ceilings.lookup("copy", "fp32", 2**19 + 2**17).gbps == 16.0  # nearer 1 MiB in log size
    assert ceilings.lookup("add", "fp32", 10).tensor_bytes == 2**18  # below the curve: its smallest size
    assert ceilings.lookup("add", "fp16", 2**20).gbps == 8.0  # another dtype's when fp16 was not measured
    assert ceilings.read_gbps("bf16") == 20.0 and ceilings.copy_gbps("fp32") == 16.0
    assert math.isnan(ceilings.lookup("matmul", "fp32", 1).gbps)


def test_ceiling_lookup_is_exact_at_every_size_the_ceilings_measured():
    odd = ODD_ELEMENTS * 4  # 393 728 bytes: between 256 KiB and 1 MiB, nearer 256 KiB in log size
    rows = _ceiling_rows({"copy": 8.0}, sizes=(2**18, odd, 2**20), dtypes=("fp32",))
    ceilings = Ceilings(CEILINGS.frame(rows))
    hit = ceilings.lookup("copy", "fp32", odd)
    assert hit.tensor_bytes == odd and hit.gbps == 16.0 and hit.method == "torch"  # not 256 KiB's 8.0
    assert hit.plateau == 16.0 and ceilings.largest("copy", "fp32") == 16.0
    assert ceilings.lookup("copy", "fp32", odd + 4).tensor_bytes == odd  # off the matrix: the nearest


def test_the_ceilings_are_measured_at_the_matrix_sizes_and_the_plateau_only():
    matrix = matrix_tensor_bytes(["gelu", "softmax", "add"], "auto", ["fp32", "bf16"], CPU)
    assert matrix["copy"]["fp32"] == sorted({n * 4 for n in (ODD_ELEMENTS, 2**20, 2**22, 1823 * 781, 1024 * 1024,
                                                             64 * 65536)})
    assert matrix["add"]["bf16"] == [n * 2 for n in (ODD_ELEMENTS, 2**20, 2**22)] and "read" not in matrix
    assert plateau_bytes(matrix, "bf16", 1) == 2**23 and plateau_bytes(matrix, "fp16", 7) == 7
    assert ceiling_sizes(matrix, "read", "fp32", 2**24) == [2**24]  # the decode roofline's plateau only
    assert ceiling_sizes(matrix, "add", "fp32", 2**22) == [ODD_ELEMENTS * 4, 2**22]  # above the plateau: not measured
    sized = matrix_tensor_bytes(["gelu"], {"gelu": [1000, 3000]}, ["fp32"], CPU)
    assert sized == {"copy": {"fp32": [4000, 12000]}}
    rows = measure_ceilings({"dtypes": ["fp32"], "matmul_n": 64}, FAST, target="t", fingerprint="f",
                            matrix=sized, device=CPU)
    measured = {(r["kind"], r["tensor_bytes"]) for r in rows if r["kind"] != "matmul" and r["status"] == "ok"}
    assert measured == {("copy", 4000), ("copy", 12000), ("read", 12000), ("add", 12000)}
    # Inductor's kernels are GPU methods of copy and add: on a CPU each size would be a C++ compile.
    compiled = [r for r in rows if r.get("method") == INDUCTOR]
    assert {(r["kind"], r["tensor_bytes"]) for r in compiled} == {("copy", 4000), ("copy", 12000), ("add", 12000)}
    assert all(r["status"] == "skipped" and "C++ compile" in r["reason"] for r in compiled)
    assert callable(pattern_methods("add", "no GPU", compile_reason="")[INDUCTOR])
    # Every method is rated at its fastest decile (p10 time), not its median.
    for r in (r for r in rows if r["status"] == "ok"):
        rate, amount = (r["tflops"], 2 * 64**3 / 1e3) if r["kind"] == "matmul" else (r["gbps"], r["bytes_moved"])
        assert rate == pytest.approx(amount / r["p10_ms"] / 1e6) and r["p10_ms"] <= r["median_ms"]


def test_the_triton_sweep_is_screened_and_only_contenders_are_timed_in_full():
    medians = {"triton b1 w1": 1.0, "triton b2 w2": 1.09, "triton b3 w3": 1.5, "triton b4 w4": None, "torch.add": 9.0}
    calls = []

    def timed(name, builder, settings):
        calls.append((name, settings.min_reps))
        if medians[name] is None:
            return {"status": "failed", "reason": "does not compile"}
        return {"status": "ok", "reason": "", "median_ms": medians[name], "reps": settings.min_reps}

    behind = screen_sweep({name: object() for name in medians}, FAST, timed)
    assert set(behind) == {"triton b3 w3", "triton b4 w4"} and behind["triton b4 w4"]["status"] == "failed"
    assert behind["triton b3 w3"]["reason"].startswith("screened out: 1.5x the time of triton b1 w1 in 10 ")
    assert "torch.add" not in {name for name, _ in calls} and {reps for _, reps in calls} == {SCREEN_REPS}
    # Through a real measurement: every method keeps its row, the loser with its screen's timing (a sleep, so
    # that other jobs on a shared CPU cannot make the fast one as slow).
    fast = lambda ins, out: (lambda: out.copy_(ins[0]))  # noqa: E731
    slow = lambda ins, out: (lambda: time.sleep(0.1))  # noqa: E731
    rows = measure_pattern("copy", "fp32", 2**20, {"triton b1 w1": fast, "triton b2 w2": slow, "memcpy": fast},
                           FAST, CPU)
    by_method = {r["method"]: r for r in rows}
    assert [r["status"] for r in rows] == ["ok"] * 3 and by_method["triton b2 w2"]["reason"].startswith("screened")
    assert by_method["triton b1 w1"]["reason"] == "" and by_method["memcpy"]["reason"] == ""


def test_a_size_is_latency_bound_below_half_the_plateau_and_then_not_judged():
    assert LATENCY_FRACTION == 0.5
    assert regime(50.0, 100.0) == "bandwidth" and regime(49.99, 100.0) == "latency"
    assert regime(10.0, math.nan) == "bandwidth" and regime(math.nan, 100.0) == ""
    latency = placement(1000.0, Hit(40.0, 2**18, "memcpy", 1.01, plateau=100.0), 1.01)
    assert latency["regime"] == "latency" and math.isnan(latency["pct_of_ceiling"])
    assert latency["above_ceiling"] is None and latency["ceiling_gbps"] == 40.0 and latency["ceiling_bytes"] == 2**18
    bandwidth = placement(45.0, Hit(50.0, 2**18, "memcpy", 1.01, plateau=100.0), 1.01)
    assert bandwidth["regime"] == "bandwidth" and bandwidth["pct_of_ceiling"] == pytest.approx(90.0)
    assert bandwidth["above_ceiling"] is False


def test_a_planted_row_above_its_ceiling_is_flagged_and_shown_in_red(tmp_path):
    # A ceiling far below anything the CPU does, at every size: bandwidth-bound (plateau alike), so judged.
    slow = [{**r, "gbps": r["gbps"] * 1e-6} for r in _ceiling_rows({"add": 4.0}, sizes=(2**18,), dtypes=("fp32",))]
    row = run_cell("add", "native", shapes=[(1 << 16,)], dtypes=["fp32"], settings=FAST, ctx=ctx(), fingerprint="fp",
                   ceilings=Ceilings(CEILINGS.frame(slow)), progress=False)[0]
    assert row["regime"] == "bandwidth" and row["above_ceiling"] is True and row["pct_of_ceiling"] > 1e4
    planted = BENCH.frame([{"target": "local", "fingerprint": "fp", **row, "op": "gelu"}])
    section = _section("local", tmp_path, planted)
    assert len(section["above_ceiling"]) == 1
    assert "1 benchmark row above its measured ceiling" in _render(tmp_path / "results", "bench", section)
    summary = _render(tmp_path / "results", "summary")
    flag = 'Above a ceiling:</strong> <span class="status-incorrect">1 row</span> (1 in <code>bench/gelu.csv</code>)'
    assert flag in summary


def test_a_row_may_exceed_its_ceiling_only_by_the_spread_of_both():
    ceiling = Hit(100.0, 2**20, "memcpy", 1.02)
    assert not above_ceiling(103.0, ceiling, 1.01)  # 100 x 1.02 x 1.01 = 103.02
    assert above_ceiling(103.1, ceiling, 1.01)
    assert not above_ceiling(500.0, Hit(math.nan, math.nan, "", math.nan), 1.0)


def _placed_row(op, impl, gbps, size=2**20, regime="bandwidth", status="ok", dedicated=100.0, spread=1.0):
    """A cell's row as the runner writes it: placed against the dedicated ceiling of its size (spreads p90/p10)."""
    return {"op": op, "impl": impl, "status": status, "regime": regime, "pattern": "copy", "dtype": "fp32",
            "tensor_bytes": size, "gbps": gbps, "ceiling_gbps": dedicated, "dedicated_ceiling_gbps": dedicated,
            "ceiling_method": "memcpy", "ceiling_spread": 1.01, "ceiling_bytes": size, "pct_of_ceiling": gbps,
            "p10_ms": 1.0, "p90_ms": spread,
            "above_ceiling": above_ceiling(gbps, Hit(dedicated, size, "memcpy", 1.01), spread) if status == "ok"
            else None}


def test_a_row_faster_than_every_method_becomes_the_ceiling_of_its_size_and_is_still_judged_by_the_methods():
    row = partial(_placed_row, "gelu")
    rows = pd.DataFrame([row("native", 99.0), row("triton", 101.5), row("manual", 50.0, size=2**10),
                         row("cpp_ext", 300.0, size=2**8, regime="latency"),
                         row("torch_compile", 999.0, status="failed"),
                         row("native", 90.0, size=2**12),
                         row("manual", 150.0, size=2**12),  # far beyond any faster kernel
                         row("torch_compile", 103.0, size=2**14),  # beyond the spread, within RAISE_LIMIT
                         row("native", 98.0, size=2**14),
                         row("cpp_ext", 124.0, size=2**16, spread=1.3),  # far beyond, within the spread of both
                         row("native", 93.0, size=2**16)])
    out = share_ceilings(rows)
    same = out[(out["tensor_bytes"] == 2**20) & out["impl"].isin(["native", "triton"])].set_index("impl")
    assert (same["ceiling_gbps"] == 101.5).all() and (same["dedicated_ceiling_gbps"] == 100.0).all()
    assert same.loc["triton", "pct_of_ceiling"] == pytest.approx(100.0)
    assert same.loc["native", "pct_of_ceiling"] == pytest.approx(100.0 * 99.0 / 101.5)
    assert same.loc["native", "ceiling_method"] == "gelu triton (fastest row; above every method)"
    past = out[out["tensor_bytes"] == 2**14].set_index("impl")
    assert (past["ceiling_gbps"] == 103.0).all() and not past["above_ceiling"].any()
    wide = out[out["tensor_bytes"] == 2**16].set_index("impl")
    assert (wide["ceiling_gbps"] == 124.0).all() and (wide["dedicated_ceiling_gbps"] == 100.0).all()
    assert wide.loc["native", "pct_of_ceiling"] == pytest.approx(100.0 * 93.0 / 124.0)
    # Other sizes, latency-bound and failed rows, and a row beyond RAISE_LIMIT and the spread neither raise nor
    # get raised; the last stays above 100% and above its ceiling.
    raised = out["ceiling_gbps"] != 100.0
    assert set(zip(out.loc[raised, "impl"], out.loc[raised, "tensor_bytes"], strict=True)) == {
        ("native", 2**20), ("triton", 2**20), ("torch_compile", 2**14), ("native", 2**14), ("cpp_ext", 2**16),
        ("native", 2**16)}
    assert (out.loc[~raised, "ceiling_method"] == "memcpy").all()
    flagged = out["above_ceiling"].astype(str).eq("True")
    assert flagged.sum() == 1 and out.loc[flagged, "pct_of_ceiling"].item() == 150.0


def test_every_table_shares_one_ceiling_per_pattern_dtype_and_size():
    """The gelu and softmax tables place their copy rows of one size against one ceiling, raised once by the fastest
    row of either, and the highest reference timed beside any of them is the dedicated ceiling of all."""
    rows = pd.DataFrame([_placed_row("gelu", "triton", 101.0), _placed_row("gelu", "native", 97.0),
                         _placed_row("softmax", "torch_compile", 102.0), _placed_row("softmax", "native", 80.0),
                         _placed_row("gelu", "native", 95.0, size=2**22, dedicated=98.0),
                         _placed_row("softmax", "native", 90.0, size=2**22, dedicated=99.0)])
    out = share_ceilings(rows)
    assert out.groupby("tensor_bytes")["ceiling_gbps"].nunique().eq(1).all()
    assert (out.loc[out["tensor_bytes"] == 2**20, "ceiling_gbps"] == 102.0).all()
    assert (out.loc[out["tensor_bytes"] == 2**22, "ceiling_gbps"] == 99.0).all()
    assert (out.loc[out["tensor_bytes"] == 2**22, "dedicated_ceiling_gbps"] == 99.0).all()
    assert raised_rows(out) == 4


def test_a_row_that_sets_its_own_ceiling_is_exactly_100_percent():
    """100 * x / x rounds above 100 for some x (the H100 run had two such rows at 100.00000000000001%)."""
    gbps = 3048.463044334574  # that run's gelu triton row
    assert 100.0 * gbps / gbps > 100.0  # the rounding this guards against
    assert pct_of(gbps, gbps) == 100.0
    rows = pd.DataFrame([_placed_row("add", impl, g, size=2**30, dedicated=3040.0)
                         for impl, g in (("torch_compile", gbps), ("native", 2500.0))])
    out = share_ceilings(rows).set_index("impl")
    assert out.loc["torch_compile", "pct_of_ceiling"] == 100.0 and out["pct_of_ceiling"].max() <= 100.0


def test_inputs_rotate_past_the_cache_only_when_it_is_not_flushed():
    info = gpu(80)
    assert rotation_sets(replace(FAST, flush_cache=True), info, 2**20) == 1
    assert rotation_sets(FAST, info, 2**20) == 8  # capped
    assert rotation_sets(FAST, info, 40 * 2**20) == 3  # 2 x 50 MiB L2 over 40 MiB sets
    assert rotation_sets(FAST, info, 2**30) == 1


# ------------------------------------------------------------------------------ sizes


def test_cpu_sizes_stay_small_and_keep_the_odd_cases():
    for op in OPS:
        shapes = resolve_sizes(op, "auto", CPU)
        assert all(op_spec(op).numel(s) * 4 <= 16 * 2**20 for s in shapes)
    assert resolve_sizes("gelu", "auto", CPU)[0] == (ODD_ELEMENTS,)
    assert resolve_sizes("softmax", "auto", CPU)[0] == ODD_ROWS


def test_gpu_sizes_scale_with_memory_and_include_the_study_and_target_shapes():
    big = {op: resolve_sizes(op, "auto", gpu(80)) for op in OPS}
    assert max(s[0] for s in big["gelu"]) * 4 == GPU_CAP_BYTES  # 4 GiB fp32 tensors on an 80 GB card
    assert (STUDY_GELU_ELEMENTS,) in big["gelu"] and (ODD_ELEMENTS,) in big["add"]
    assert all(tuple(s) in big["softmax"] for s in TARGET_SOFTMAX) and ODD_ROWS in big["softmax"]
    assert any(n * 4 >= 256 * 2**20 for (n,) in big["add"])
    small = resolve_sizes("gelu", "auto", gpu(16))
    assert max(s[0] for s in small) * 4 == GIB  # 1/16 of the memory
    assert len(resolve_sizes("softmax", "auto", gpu(4))) < len(big["softmax"])
    assert max_tensor_bytes(gpu(80), 64) == 64 * 2**20
    assert auto_sizes("gelu", gpu(80), 1) == [(ODD_ELEMENTS,)]  # never empty


def test_configured_sizes_are_parsed_and_validated():
    assert resolve_sizes("softmax", {"softmax": [[8, 16], [8, 16]]}, CPU) == [(8, 16)]
    assert resolve_sizes("gelu", {"softmax": [[8, 16]]}, CPU) == resolve_sizes("gelu", "auto", CPU)
    assert parse_shape("softmax", "1823x781") == ODD_ROWS and parse_shape("add", 7) == (7,)
    with pytest.raises(ValueError, match=r"is not \[rows, cols\]"):
        parse_shape("softmax", [5])
    with pytest.raises(ValueError, match="not a positive element count"):
        parse_shape("gelu", 0)


# ------------------------------------------------------------------------------ outcomes


def test_unavailable_implementations_become_rows_with_the_reason():
    registry = Registry()
    registry.register("gelu", "gone", availability=lambda c: Unavailable("no such tool here"))(
        lambda case, inputs, out: (lambda: inputs[0]))
    registry.register("gelu", "broken", availability=lambda c: Unavailable("the build failed: x.cu:3", "failed"))(
        lambda case, inputs, out: (lambda: inputs[0]))
    for impl, status in (("gone", "skipped"), ("broken", "failed")):
        rows = run_cell("gelu", impl, shapes=[(8,), (16,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                        fingerprint="fp", registry=registry, progress=False)
        assert [r["status"] for r in rows] == [status, status] and rows[0]["reason"]


def test_triton_without_a_gpu_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    row = run_cell("gelu", "triton", shapes=[(8,)], dtypes=["fp32"], settings=FAST, ctx=ctx(), fingerprint="fp",
                   progress=False)[0]
    assert row["status"] == "skipped"
    assert row["reason"] in ("Triton is not installed", "Triton needs a GPU driver: PyTorch is a CPU-only build")


def test_an_out_of_memory_case_is_oom_and_the_rest_goes_on():
    registry = Registry()

    @registry.register("gelu", "greedy")
    def greedy(case, inputs, out):
        if case.shape[0] > 100:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return lambda: manual_gelu(inputs[0])

    @registry.register("gelu", "raises")
    def raises(case, inputs, out):
        raise RuntimeError("kernel launch failed\nsecond line")

    rows = run_cell("gelu", "greedy", shapes=[(64,), (4096,), (65,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                    fingerprint="fp", registry=registry, progress=False)
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"]
    assert rows[1]["reason"].startswith("OutOfMemoryError: CUDA out of memory")
    row = run_cell("gelu", "raises", shapes=[(64,)], dtypes=["fp32"], settings=FAST, ctx=ctx(), fingerprint="fp",
                   registry=registry, progress=False)[0]
    assert row["status"] == "failed" and row["reason"] == "RuntimeError: kernel launch failed"


def test_a_cell_takes_its_cases_blocks_in_turn_over_the_minimum_span():
    registry = Registry()
    order: list[int] = []
    calls = {"n": 0}

    @registry.register("gelu", "traced")
    def traced(case, inputs, out):
        def run():
            order.append(case.shape[0])
            return manual_gelu(inputs[0])
        return run

    @registry.register("gelu", "dies_while_timed")
    def dies(case, inputs, out):
        def run():
            calls["n"] += 1
            if case.shape[0] == 64 and calls["n"] > 40:
                raise RuntimeError("device lost")
            return manual_gelu(inputs[0])
        return run

    settings = replace(FAST, min_reps=16, max_reps=16, min_span_s=0.5)
    start = time.monotonic()
    rows = run_cell("gelu", "traced", shapes=[(64,), (96,)], dtypes=["fp32"], settings=settings, ctx=ctx(),
                    fingerprint="fp", registry=registry, progress=False)
    assert time.monotonic() - start >= 0.5
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["times_ms"].count("|") == 7 for r in rows)
    timed = order[order.index(96, order.index(96) + 1):]  # after the second case's gate and warm-up
    switches = sum(a != b for a, b in itertools.pairwise(timed))
    assert switches >= 14  # 8 blocks each, alternating: at least 2 x 8 - 2 changes of case
    rows = run_cell("gelu", "dies_while_timed", shapes=[(64,), (96,)], dtypes=["fp32"], settings=settings,
                    ctx=ctx(), fingerprint="fp", registry=registry, progress=False)
    assert [r["status"] for r in rows] == ["failed", "ok"] and rows[0]["reason"] == "RuntimeError: device lost"


@pytest.mark.slow
def test_a_cpu_cell_times_the_reference_beside_each_case_and_places_the_case_against_it(tmp_path):
    """timing.reference (auto: on a CPU, off on a GPU): the pattern's reference method at each case's size and
    dtype, one block after each of the case's; where it beat the ceilings job's figure it is the row's ceiling."""
    assert TimingSettings().for_device(CPU).reference is True
    assert TimingSettings().for_device(gpu(80)).reference is False
    CEILINGS.write(_ceiling_rows({"copy": 1e-3, "add": 1e6}), tmp_path / "ceilings.csv")
    ceilings = Ceilings.load(tmp_path / "ceilings.csv")
    settings = replace(FAST, reference="auto")
    for op, method, raised in (("gelu", "memcpy", True), ("add", "torch.add", False)):
        rows = run_cell(op, "native", shapes=[(1 << 16,)], dtypes=["fp32", "bf16"], settings=settings, ctx=ctx(),
                        fingerprint="fp", ceilings=ceilings, progress=False)
        for row in rows:
            assert row["status"] == "ok" and row["reference_method"] == method and row["reference_gbps"] > 0
            assert row["reference_times_ms"].count("|") == row["times_ms"].count("|") > 0
            assert f"each block beside one of {method}" in row["method"]
            if raised:  # the job's copy ceiling (1e-3 GB/s) is far below the memcpy timed beside the case
                assert row["ceiling_method"] == "memcpy (timed beside the case)"
                assert row["ceiling_gbps"] == row["dedicated_ceiling_gbps"] == row["reference_gbps"]
            else:
                assert row["ceiling_method"] == "torch" and row["ceiling_gbps"] == 1e6
    BENCH.write(rows, tmp_path / "add.csv")
    assert BENCH.read(tmp_path / "add.csv")["reference_method"].eq("torch.add").all()


@pytest.mark.slow
def test_torch_compile_cases_timed_in_turn_keep_their_graphs_and_a_recompile_limit_fails_loudly(monkeypatch):
    import gpulab.bench.impls as impls
    import gpulab.core.compiled as compiled

    ok = run_cell("gelu", "torch_compile", shapes=[(64,), (96,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                  fingerprint="fp", progress=False)
    assert [r["status"] for r in ok] == ["ok", "ok"]
    # Past dynamo's recompile limit the second case must fail, naming it, not run eager PyTorch unseen.
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(impls, "_compiled", {})
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        rows = run_cell("gelu", "torch_compile", shapes=[(64,), (96,)], dtypes=["fp32"], settings=FAST,
                        ctx=ctx(), fingerprint="fp", progress=False)
    torch._dynamo.reset()
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "failed", rows[1]["reason"]
    assert "limit" in rows[1]["reason"].lower()


@pytest.mark.slow
def test_torch_compile_runs_on_cpu_or_says_why():
    row = run_cell("add", "torch_compile", shapes=[(1000,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                   fingerprint="fp", progress=False)[0]
    if impls.compile_unavailable(ctx(), "add") is None:
        assert row["status"] == "ok", row["reason"]
        assert row["cold_call_ms"] > row["median_ms"]  # compilation lands in the first call, not the timing
    else:
        assert row["status"] == "skipped" and "C++ compiler" in row["reason"]


# ------------------------------------------------------------------------------ aggregate and report


def test_aggregate_orders_cells_and_keeps_the_schema(tmp_path):
    paths = []
    for impl in ("triton", "native"):
        rows = run_cell("add", "native" if impl == "native" else "manual", shapes=[(4096,), (8,)],
                        dtypes=["bf16", "fp32"], settings=FAST, ctx=ctx(), fingerprint="fp", progress=False)
        rows = [{**r, "impl": impl} for r in rows]
        paths.append(tmp_path / f"add__{impl}.csv")
        BENCH.write(rows, paths[-1])
    table = aggregate(paths)
    assert list(table.columns) == BENCH.names
    # A CPU run: energy and datasheet columns are there, unknown, and say why.
    ok = table[table["status"] == "ok"]
    assert ok["energy_j"].isna().all() and ok["gb_per_j"].isna().all() and ok["datasheet_gbps"].isna().all()
    assert ok["energy_reason"].str.startswith("unknown: no GPU").all()
    assert table[["impl", "size", "dtype"]].values.tolist()[:4] == [
        ["native", "8", "fp32"], ["native", "8", "bf16"], ["native", "4096", "fp32"], ["native", "4096", "bf16"]]


def _run_in_triton_interpreter(code: str) -> None:
    """Runs ``code`` in a fresh interpreter with TRITON_INTERPRET=1 (Triton reads it at import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_triton_kernels_are_correct_in_the_interpreter():
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from gpulab.core.ops import check\n"
        "from gpulab.kernels.triton.gelu import gelu\n"
        "from gpulab.kernels.triton.add import add\n"
        "from gpulab.kernels.triton.softmax import softmax\n"
        "x = torch.randn(98432) * 2; y = torch.randn(98432); m = torch.randn(1823, 781) * 3\n"
        "assert check('gelu', gelu(x), [x], 'fp32').passed\n"
        "assert check('add', add(x, y), [x, y], 'fp32').passed\n"
        "assert check('softmax', softmax(m), [m], 'fp32').passed\n"
        "w = torch.randn(3, 9000) * 3\n"
        "assert check('softmax', softmax(w, looped_block=1024), [w], 'fp32').passed\n"
        "v = torch.randn(2, 20000) * 3  # wider than a program: looped, since the interpreter cannot split\n"
        "assert check('softmax', softmax(v), [v], 'fp32').passed\n"
    )
    _run_in_triton_interpreter(code)


def _bench_tables(run: Path) -> list[Path]:
    return sorted(p for p in (run / "bench").glob("*.csv") if p.name != "ceilings.csv")


def _in_current_schema(run: Path) -> bool:
    try:
        CEILINGS.read(run / "bench" / "ceilings.csv")
        for path in _bench_tables(run):
            BENCH.read(path)
    except SchemaError:
        return False
    return True


def _runs() -> list[str]:
    """Recorded runs under tests/fixtures/bench (<target>/bench/*.csv) in the current schema; older ones are
    skipped (refresh them from a run of the workflow: tests/fixtures/bench/README.md)."""
    runs = sorted(p for p in FIXTURES.iterdir() if (p / "bench" / "ceilings.csv").is_file())
    return [run.name for run in runs if _in_current_schema(run)]


RUNS = _runs()


def _section(run: str, tmp_path: Path, extra_rows: pd.DataFrame | None = None) -> dict:
    """The report section over one recorded run (optionally with rows added to its gelu table)."""
    import json
    import shutil

    from gpulab.report.render import ReportContext
    from gpulab.report.results import ResultsIndex
    from gpulab.report.sections import bench

    root = tmp_path / "results"
    shutil.copytree(FIXTURES / run, root / run)
    if extra_rows is not None:
        path = root / run / "bench" / "gelu.csv"
        pd.concat([pd.read_csv(path), extra_rows], ignore_index=True).to_csv(path, index=False)
    env = root / run / "env" / "env.json"
    if not env.is_file():
        env.parent.mkdir(parents=True, exist_ok=True)
        env.write_text(json.dumps({"fingerprint": "fixture", "device": {"name": run, "gpu_available": run != "local"}}))
    return bench.build(ReportContext(ResultsIndex(root), root / "report.html", {}, "test"))


def _render(results: Path, name: str, data: dict | None = None) -> str:
    """One report section's HTML over ``results`` (from ``data`` when already built), whitespace collapsed."""
    import importlib

    from gpulab.report.render import ReportContext, environment
    from gpulab.report.results import ResultsIndex

    module = importlib.import_module(f"gpulab.report.sections.{name}")
    ctx = ReportContext(ResultsIndex(results), results.parent / "report.html", {}, "test")
    html = environment().get_template(module.TEMPLATE).render(ctx=ctx, **(data or module.build(ctx)))
    return " ".join(html.split())


def test_the_recorded_runs_exist_in_the_current_schema():
    assert "local" in RUNS, "tests/fixtures/bench/local: refresh it from a CPU run of the workflow (see README.md)"


@pytest.mark.parametrize("run", RUNS)
def test_no_ok_bandwidth_row_exceeds_its_ceiling_beyond_the_spread(run):
    ceilings = Ceilings.load(FIXTURES / run / "bench" / "ceilings.csv")
    rows = pd.concat([BENCH.read(p) for p in _bench_tables(FIXTURES / run)], ignore_index=True)
    ok = rows[rows["status"] == "ok"]
    assert not ok.empty and ok["pattern"].isin(["copy", "add"]).all() and ok["stable"].notna().all()
    assert ok["regime"].isin(["bandwidth", "latency"]).all()
    own = [_dedicated(ceilings, r) for r in ok.itertuples(index=False)]
    # Tables written since the ceilings are shared (they carry ceiling_spread) take the fastest dedicated ceiling of
    # a size over every table's rows; older ones each row's own.
    shared = ok["ceiling_spread"].notna().any()
    fastest: dict[tuple, Hit] = {}
    for r, hit in zip(ok.itertuples(index=False), own, strict=True):
        key = (r.pattern, r.dtype, r.tensor_bytes)
        fastest[key] = max(fastest.get(key, hit), hit, key=lambda h: h.gbps)
    above = []
    for r, hit in zip(ok.itertuples(index=False), own, strict=True):
        hit = fastest[r.pattern, r.dtype, r.tensor_bytes] if shared else hit
        assert hit.gbps == pytest.approx(r.dedicated_ceiling_gbps)
        # The ceiling is the dedicated methods' unless a row of the same traffic beat them all.
        raised = r.ceiling_gbps > hit.gbps * (1 + 1e-12)
        assert (hit.method == r.ceiling_method) != raised, (r.op, r.size, r.dtype, r.ceiling_method)
        # Measured at the row's own size, and the regime follows from it.
        assert hit.tensor_bytes == r.tensor_bytes and hit.regime == r.regime, (r.op, r.size, r.dtype)
        if r.regime == "latency":
            assert pd.isna(r.pct_of_ceiling) and pd.isna(r.above_ceiling)
            continue
        # Beyond the dedicated methods' spread only as a faster kernel, within RAISE_LIMIT, that is the ceiling.
        if above_ceiling(r.gbps, hit, r.p90_ms / r.p10_ms) and not (r.gbps <= hit.gbps * RAISE_LIMIT and raised):
            above.append(f"{r.op}/{r.impl} {r.size} {r.dtype}: {r.gbps:.4g} GB/s vs {hit.gbps:.4g} ({hit.method})")
    assert not above, "rows above their ceiling (the ceiling is not trustworthy):\n" + "\n".join(above)
    assert not ok["above_ceiling"].astype(str).str.lower().eq("true").any()
    bandwidth = ok[ok["regime"] == "bandwidth"]
    assert (bandwidth["pct_of_ceiling"] <= 100.0 + 1e-9).all(), bandwidth.nlargest(3, "pct_of_ceiling")


def _dedicated(ceilings: Ceilings, r) -> Hit:
    """A row's dedicated ceiling: the ceilings job's at its size, or the reference timed beside it where faster."""
    hit = ceilings.lookup(r.pattern, r.dtype, r.tensor_bytes)
    if pd.notna(r.reference_gbps) and r.reference_gbps > hit.gbps:
        stats = summarize(parse_times(r.reference_times_ms))
        hit = Hit(r.reference_gbps, hit.tensor_bytes, f"{r.reference_method} (timed beside the case)",
                  stats["p90_ms"] / stats["p10_ms"], hit.plateau)
    return hit


def _as_cells(run: str) -> pd.DataFrame:
    """A recorded run's tables as its cells wrote them: each row placed against its dedicated ceiling (what the
    tables kept in dedicated_ceiling_gbps), before any raise."""
    ceilings = Ceilings.load(FIXTURES / run / "bench" / "ceilings.csv")
    rows = pd.concat([BENCH.read(p) for p in _bench_tables(FIXTURES / run)], ignore_index=True)
    hits = [_dedicated(ceilings, r) for r in rows.itertuples(index=False)]
    ok = rows["status"] == "ok"
    rows.loc[ok, "ceiling_method"] = [h.method for h, keep in zip(hits, ok, strict=True) if keep]
    rows.loc[ok, "ceiling_spread"] = [h.spread for h, keep in zip(hits, ok, strict=True) if keep]
    rows.loc[ok, "ceiling_gbps"] = rows.loc[ok, "dedicated_ceiling_gbps"]
    return rows


def test_the_h100_tables_get_one_ceiling_per_pattern_dtype_and_size():
    """The recorded H100 run (ceiling methods rated at their fastest decile): each (pattern, dtype, size) has one
    ceiling in all three tables and no row above it, and its cells shared again are placed as recorded. 45 of its 285
    rows are placed against a benchmarked row that beat every method at its size (by 0.007-0.24%)."""
    if "h100" not in RUNS:
        pytest.skip("tests/fixtures/bench/h100 predates the current schema")
    recorded = pd.concat([BENCH.read(p) for p in _bench_tables(FIXTURES / "h100")], ignore_index=True)
    keys = ["pattern", "dtype", "tensor_bytes"]
    assert recorded[recorded["status"] == "ok"].groupby(keys)["ceiling_gbps"].nunique().eq(1).all()
    shared = share_ceilings(_as_cells("h100"))
    ok = shared[shared["status"] == "ok"]
    assert len(ok) == 285 and ok.groupby(keys)["ceiling_gbps"].nunique().eq(1).all()
    assert not ok["above_ceiling"].astype(str).eq("True").any()
    assert (ok.loc[ok["regime"] == "bandwidth", "pct_of_ceiling"] <= 100.0).all()
    assert raised_rows(shared) == raised_rows(recorded) == 45


@pytest.mark.parametrize("run", RUNS)
def test_every_ceiling_has_a_winning_method_and_the_losers_are_kept(run):
    table = CEILINGS.read(FIXTURES / run / "bench" / "ceilings.csv")
    best = table[table["best"].astype(str).str.lower() == "true"]
    for kind in ("read", "copy", "add", "matmul"):
        mine = table[table["kind"] == kind]
        assert not best[best["kind"] == kind].empty, kind
        for _, group in mine[mine["status"] == "ok"].groupby(["dtype", "size"] if kind != "matmul" else ["dtype"]):
            winner = group[group["best"].astype(str).str.lower() == "true"]
            column = "tflops" if kind == "matmul" else "gbps"
            assert len(winner) == 1 and winner[column].iloc[0] == group[column].max()
    skipped = table[table["status"] == "skipped"]
    assert skipped["reason"].str.len().gt(0).all()


def test_report_section_builds_figures_and_fastest_only_from_correct_rows(tmp_path):
    base = pd.read_csv(FIXTURES / "local" / "bench" / "gelu.csv")
    fake = base[(base["status"] == "ok") & (base["impl"] == "native")].head(1).assign(
        impl="cheater", status="incorrect", reason="relative error 1 exceeds", median_ms=1e-9, gbps=1e12)
    section = _section("local", tmp_path, fake)
    for op in section["ops"]:
        assert [f.alt for t in op["targets"] for f in t["figures"]], op["op"]
        assert not op["fastest"].empty and "cheater" not in set(op["fastest"]["fastest"])
        assert {"manual", "native"} <= set(op["correctness"]["impl"])
    assert (section["ceilings"]["method"].notna()).all() and section["above_ceiling"].empty


@pytest.mark.slow
def test_triton_ceiling_kernels_are_correct_in_the_interpreter():
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from gpulab.kernels.triton import ceiling\n"
        "shapes = [(n, block, warps) for n in (98432, 65536) for block, warps in ceiling.sweep()[:2]]\n"
        "assert any(n % block for n, block, _ in shapes) and any(not n % block for n, block, _ in shapes)\n"
        "for n, block, warps in shapes:  # masked and unmasked (EVEN) launches\n"
        "    x = torch.randn(n); y = torch.randn(n)\n"
        "    out = torch.empty_like(x); partial = torch.empty(-(-x.numel() // block))\n"
        "    assert torch.equal(ceiling.copy(x, out, block, warps), x)\n"
        "    assert torch.equal(ceiling.add(x, y, out, block, warps), x + y)\n"
        "    assert abs(float(ceiling.read(x, partial, block, warps).sum()) - float(x.sum())) < 1e-2\n"
    )
    _run_in_triton_interpreter(code)


@pytest.fixture(scope="module")
def h100_section(tmp_path_factory):
    """The report section over the benchmark rows measured on an H100 (tests/fixtures/bench/h100)."""
    if "h100" not in RUNS:
        pytest.skip("tests/fixtures/bench/h100 predates the current schema: refresh it from a GPU run")
    return _section("h100", tmp_path_factory.mktemp("h100"))


def test_report_section_sets_the_study_gelu_beside_ours(h100_section):
    study = h100_section["study"].set_index("impl")
    assert study.loc["manual", "study (ms)"] == 8.1 and study.loc["torch_compile", "study (ms)"] == 1.47
    assert h100_section["study_measured"]
    assert study["h100 (ms)"].notna().all()  # all five ran at 2^28 fp32 on the H100
    assert study.loc["manual", "h100 (ms)"] > 5 * study.loc["native", "h100 (ms)"]


def test_report_section_goal_verdicts_follow_from_the_numbers(h100_section):
    goals = h100_section["goals"]
    assert set(goals["impl"]) == {"triton", "cpp_ext"} and set(goals["op"]) == {"gelu", "softmax", "add"}
    softmax = goals[goals["op"] == "softmax"]
    # Sizes read "64 MiB · 65536 × 256 fp32": the shape sits between the bytes and the dtype.
    shapes = {size.split(" · ")[1].rsplit(" ", 1)[0].replace(" × ", "x") for size in softmax["size"]}
    assert shapes == {"16384x1024", "4096x16384", "65536x256"}
    for r in goals.to_dict("records"):
        met = r["% of ceiling"] >= r["goal %"] and r["% slower than best(native, compile)"] <= 3.0
        assert (r["verdict"] == "met") == met, r


# ------------------------------------------------------------------------------ compiling before the claim


class _Warmups:
    """Stands in for a jitted kernel's ``warmup``: records what each call would compile."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def warmup(self, *args, grid, **kwargs) -> None:
        self.calls.append((args, kwargs))


def test_the_triton_cells_compile_exactly_what_the_autotuner_launches_before_the_claim(monkeypatch):
    from types import SimpleNamespace

    from gpulab.kernels.triton import add, config, gelu, softmax

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    target = config.target_of(gpu(80))
    for module, kernel, pointers in ((gelu, "gelu_kernel", 2), (add, "add_kernel", 3)):
        fake = SimpleNamespace(configs=getattr(module, kernel).configs, fn=_Warmups())
        monkeypatch.setattr(module, kernel, fake)
        getattr(module, f"warm_{module.__name__.rsplit('.', 1)[1]}")((1000, 7), torch.bfloat16, target)
        # what the autotuner times on this family, with the options it launches with (Config.all_kwargs)
        launched = [c.all_kwargs() for c in fake.configs
                    if (c.kwargs["BLOCK_SIZE"], c.num_warps) in set(config.elementwise_shapes(target))]
        assert len(launched) == len(config.elementwise_shapes(target))
        assert [kw for _, kw in fake.fn.calls] == [{"OFFSETS_64": False, **kw} for kw in launched]
        assert all(args == (torch.bfloat16,) * pointers + (7000,) for args, _ in fake.fn.calls)
    # softmax compiles the one launch softmax() makes for the shape, with the same arguments' types
    for shape, kernel in (((4096, 1000), "softmax_kernel"), ((64, 200_000), "softmax_split_kernel")):
        fake = _Warmups()
        monkeypatch.setattr(softmax, kernel, fake)
        softmax.warm_softmax(shape, torch.float16, target)
        choice = softmax.launch_choice(*shape, 2, target)
        [(args, meta)] = fake.calls
        assert meta["num_warps"] == choice.num_warps and meta["BLOCK_N"] == choice.block_n
        assert args[:2] == (torch.float16, torch.float16) and args[-2:] == (shape[1], shape[1])


def test_a_cell_compiles_ahead_on_a_gpu_only_and_a_failure_leaves_it_to_the_first_launch(caplog):
    from gpulab.bench.runner import compile_ahead

    seen: list = []
    impl = replace(REGISTRY.get("gelu", "triton"), ahead=lambda cases, info: seen.append((cases, info)))
    compile_ahead(impl, [(8,), (16,)], ["fp32", "bf16"], CPU)
    assert seen == []
    compile_ahead(impl, [(8,), (16,)], ["fp32", "bf16"], gpu(80))
    [(cases, _)] = seen
    assert [(c.shape, c.dtype) for c in cases] == [((8,), "fp32"), ((8,), "bf16"), ((16,), "fp32"), ((16,), "bf16")]

    def broken(cases, info):
        raise RuntimeError("no ptxas")

    compile_ahead(replace(impl, ahead=broken), [(8,)], ["fp32"], gpu(80))
    assert "compiling ahead failed (RuntimeError: no ptxas)" in caplog.text


def test_each_implementation_and_dtype_gets_its_energy_at_its_largest_size(monkeypatch):
    """A counter moving at 50 W with a fake clock (each call of the implementation takes 2 ms of it): the largest
    size of each dtype gets gb_per_j from an energy block spanning at least 1.5 s; the other sizes say where their
    energy was measured, not that it is unknown."""
    import gpulab.core.timing as timing_module
    from gpulab.core import energy

    clock = install(monkeypatch, timing_module, energy)

    class AtPower:
        reason, source = "", "steady"

        def read(self) -> float:
            return 50.0 * clock.now

    spans: list[float] = []
    real_block = energy.Meter.block

    def block(meter, run):
        start = clock.now
        result = real_block(meter, run)
        spans.append(clock.now - start)
        return result

    monkeypatch.setattr(energy, "counter", lambda backend: AtPower())
    monkeypatch.setattr(energy.Meter, "block", block)
    registry = Registry()

    @registry.register("gelu", "paced")
    def paced(case, inputs, out):
        def run():
            clock.advance(0.002)
            return manual_gelu(inputs[0])
        return run

    rows = run_cell("gelu", "paced", shapes=[(64,), (4096,), (96,)], dtypes=["fp32", "bf16"], settings=FAST,
                    ctx=ctx(), fingerprint="fp", registry=registry, progress=False)
    by_case = {(r["size"], r["dtype"]): r for r in rows}
    for dtype in ("fp32", "bf16"):
        largest = by_case["4096", dtype]
        assert largest["status"] == "ok" and largest["energy_reason"] == ""
        assert largest["power_w"] == pytest.approx(50.0) and largest["energy_j"] == pytest.approx(0.1)
        assert largest["gb_per_j"] == pytest.approx(largest["bytes_moved"] / 1e9 / 0.1)
        for size in ("64", "96"):
            other = by_case[size, dtype]
            assert other["energy_reason"] == f"{ENERGY_AT_LARGEST} (4096)" and math.isnan(other["gb_per_j"])
    assert sum(span >= energy.ENERGY_SPAN_S for span in spans) == 2  # one energy block per dtype
