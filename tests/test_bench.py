"""Benchmark matrices: the registry, the correctness gate, the statistics, size scaling, outcomes,
aggregation and the report section (on the H100 rows in tests/fixtures/bench)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from gpulab.bench import impls
from gpulab.bench.correctness import THRESHOLDS, relative_error, tolerance_for
from gpulab.bench.ops import OPS, manual_gelu, op_spec, parse_shape
from gpulab.bench.registry import REGISTRY, BenchContext, Case, Registry, Unavailable
from gpulab.bench.runner import BENCH, aggregate, rotation_sets, run_case, run_cell
from gpulab.bench.sizes import (
    GPU_CAP_BYTES,
    ODD_ELEMENTS,
    ODD_ROWS,
    STUDY_GELU_ELEMENTS,
    TARGET_SOFTMAX,
    auto_sizes,
    max_tensor_bytes,
    resolve_sizes,
)
from gpulab.ceilings import CEILINGS, Ceilings
from gpulab.device import DeviceInfo
from gpulab.timing import TimingSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
FAST = TimingSettings(min_time_s=0.005, min_reps=3, max_reps=20, warmup_reps=1, flush_cache=False)
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
    assert "fused" in REGISTRY.get("gelu", "native").description


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


def test_gate_passes_the_real_implementations_on_odd_sizes():
    for op, shape in (("gelu", (ODD_ELEMENTS,)), ("softmax", ODD_ROWS), ("add", (ODD_ELEMENTS,))):
        for impl in ("manual", "native"):
            for dtype in ("fp32", "fp16", "bf16"):
                row = run_case(Case(op, impl, shape, dtype, "cpu"), ctx(), FAST)
                assert row["status"] == "ok", (op, impl, dtype, row["reason"])
                assert 0 < row["rel_err"] <= THRESHOLDS[dtype] / 2, (op, impl, dtype, row["rel_err"])


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


def test_relative_error_is_the_norm_ratio_in_float64_chunked():
    spec = op_spec("add")
    a, b = spec.make_inputs((10_000,), torch.float64, "cpu", seed=3)
    ref = a + b
    assert relative_error(spec, [a, b], ref * (1 + 1e-3), chunk_elems=999)[0] == pytest.approx(1e-3, rel=1e-9)
    spec = op_spec("softmax")
    (x,) = spec.make_inputs((37, 101), torch.float32, "cpu", seed=4)
    rel, max_abs, nonfinite = relative_error(spec, [x], torch.softmax(x.double(), -1).float(), chunk_elems=500)
    assert rel < 1e-7 and max_abs < 1e-7 and nonfinite == 0


def test_tolerances_come_from_config_over_the_defaults():
    assert tolerance_for("bf16") == THRESHOLDS["bf16"]
    assert tolerance_for("bf16", {"bf16": 0.5}) == 0.5


# ------------------------------------------------------------------------------ statistics


def test_row_statistics_follow_from_bytes_moved_and_the_measured_ceiling(tmp_path):
    rows = [{"target": "test", "fingerprint": "fp", "status": "ok", "kind": "copy", "dtype": d, "size": 1,
             "gbps": 8.0} for d in ("fp32", "bf16")]
    CEILINGS.write(rows, tmp_path / "ceilings.csv")
    ceilings = Ceilings.load(tmp_path / "ceilings.csv")
    out = run_cell("add", "native", shapes=[(1 << 16,)], dtypes=["fp32", "bf16"], settings=FAST, ctx=ctx(),
                   fingerprint="fp", ceilings=ceilings, progress=False)
    for row in out:
        itemsize = 4 if row["dtype"] == "fp32" else 2
        assert row["bytes_moved"] == 3 * (1 << 16) * itemsize
        assert row["gbps"] == pytest.approx(row["bytes_moved"] / (row["median_ms"] / 1e3) / 1e9)
        assert row["gbps_p10"] <= row["gbps"] <= row["gbps_p90"]
        assert row["pct_of_copy_bw"] == pytest.approx(100 * row["gbps"] / 8.0)
        assert row["gflops"] == pytest.approx((1 << 16) / (row["median_ms"] / 1e3) / 1e9)
        assert row["reps"] >= FAST.min_reps and row["timer"] == "perf_counter"
        assert row["method"].startswith("perf_counter, median of")
        assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] and row["cold_call_ms"] > 0


def test_copy_curve_gives_the_copy_rate_for_the_bytes_a_case_moves(tmp_path):
    from gpulab.ceilings import copy_curve_sizes

    assert copy_curve_sizes(2**30) == [4 * 2**20, 16 * 2**20, 64 * 2**20, 256 * 2**20]
    assert copy_curve_sizes(4 * 2**20) == []
    ceilings = Ceilings.load(FIXTURES / "h100" / "bench" / "ceilings.csv")
    assert ceilings.copy_gbps_for(2 * 16 * 2**20) == pytest.approx(2036.07, rel=1e-4)  # a measured point
    between = ceilings.copy_gbps_for(2 * 32 * 2**20)
    assert 2036 < between < 2713  # log-interpolated between the 16 and 64 MiB copies
    assert ceilings.copy_gbps_for(2 * 2**40) == pytest.approx(ceilings.copy_gbps("fp32"), rel=1e-3)
    assert ceilings.copy_gbps_for(10) == pytest.approx(1040.25, rel=1e-4)  # below the curve: its smallest copy


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


def test_a_spent_time_budget_skips_the_remaining_cases():
    rows = run_cell("add", "native", shapes=[(8,), (16,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                    fingerprint="fp", deadline=0.0, progress=False)
    assert [r["status"] for r in rows] == ["skipped", "skipped"] and "time budget" in rows[0]["reason"]


def test_torch_compile_runs_on_cpu_or_says_why():
    row = run_cell("add", "torch_compile", shapes=[(1000,)], dtypes=["fp32"], settings=FAST, ctx=ctx(),
                   fingerprint="fp", progress=False)[0]
    if impls.compile_unavailable(ctx()) is None:
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
    assert table[["impl", "size", "dtype"]].values.tolist()[:4] == [
        ["native", "8", "fp32"], ["native", "8", "bf16"], ["native", "4096", "fp32"], ["native", "4096", "bf16"]]


def test_triton_kernels_are_correct_in_the_interpreter():
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from gpulab.bench.correctness import relative_error\n"
        "from gpulab.bench.ops import op_spec\n"
        "from gpulab.kernels.triton.gelu import gelu\n"
        "from gpulab.kernels.triton.add import add\n"
        "from gpulab.kernels.triton.softmax import softmax\n"
        "x = torch.randn(98432) * 2; y = torch.randn(98432); m = torch.randn(1823, 781) * 3\n"
        "assert relative_error(op_spec('gelu'), [x], gelu(x))[0] < 1e-6\n"
        "assert relative_error(op_spec('add'), [x, y], add(x, y))[0] < 1e-6\n"
        "assert relative_error(op_spec('softmax'), [m], softmax(m))[0] < 1e-6\n"
        "w = torch.randn(3, 9000) * 3\n"
        "assert relative_error(op_spec('softmax'), [w], softmax(w, looped_block=1024))[0] < 1e-6\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.fixture(scope="module")
def h100_section(tmp_path_factory):
    """The report section over the benchmark rows measured on an H100 (tests/fixtures/bench/h100)."""
    import shutil

    from gpulab.report.render import ReportContext
    from gpulab.report.results import ResultsIndex
    from gpulab.report.sections import bench

    root = tmp_path_factory.mktemp("results")
    shutil.copytree(FIXTURES / "h100", root / "h100")
    env = {"fingerprint": "dev", "device": {"name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "gpu_available": True}}
    (root / "h100" / "env").mkdir()
    (root / "h100" / "env" / "env.json").write_text(pd.Series(env).to_json())
    context = ReportContext(ResultsIndex(root), root / "report.html", {}, "test")
    return bench.build(context)


def test_report_section_sets_the_study_gelu_beside_ours(h100_section):
    study = h100_section["study"].set_index("impl")
    assert study.loc["manual", "study (ms)"] == 8.1 and study.loc["torch_compile", "study (ms)"] == 1.47
    assert h100_section["study_measured"]
    assert study["h100 (ms)"].notna().all()  # all five ran at 2^28 fp32 on the H100
    assert study.loc["manual", "h100 (ms)"] > 5 * study.loc["native", "h100 (ms)"]


def test_report_section_checks_the_performance_goals_on_gpu_rows(h100_section):
    goals = h100_section["goals"]
    assert set(goals["impl"]) == {"triton", "cpp_ext"} and set(goals["op"]) == {"gelu", "softmax", "add"}
    softmax = goals[goals["op"] == "softmax"]
    assert set(softmax["size"]) == {"16384x1024", "4096x16384", "65536x256"} and set(softmax["dtype"]) == {"fp32",
                                                                                                          "bf16"}
    assert (goals.loc[goals["op"] != "softmax", "size"].astype(int) * 2 >= 256 * 2**20 / 2).all()
    assert goals["verdict"].str.match(r"^(met|missed: .+)$").all()
    # bf16 softmax at 32 MiB tensors: below 85% of the 1 GiB copy, yet about as fast as copying those bytes.
    small = softmax[(softmax["dtype"] == "bf16") & (softmax["size"] != "4096x16384")]
    assert (small["% of copy BW"] < 85).all() and (small["% of same-bytes copy"] > 95).all()


def test_report_section_builds_figures_and_fastest_only_from_correct_rows(h100_section):
    for op in h100_section["ops"]:
        assert [f.alt for t in op["targets"] for f in t["figures"]], op["op"]
        assert (op["fastest"]["fastest"].isin(["manual", "native", "cpp_ext", "triton", "torch_compile"])).all()
        assert set(op["correctness"]["impl"]) == {"manual", "native", "cpp_ext", "triton", "torch_compile"}
    ceilings = h100_section["ceilings"]
    assert math.isclose(ceilings[(ceilings["kind"] == "copy") & (ceilings["dtype"] == "fp32")]["gbps"].iloc[0],
                        3002.2309, rel_tol=1e-4)
