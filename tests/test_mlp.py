"""MLP profiling: kernel classification (recorded names of both vendors), phase attribution, the FLOP
count, and the whole profile on a small model on CPU (artifacts, schemas, the report section)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpulab.core.ceilings import CEILINGS, Ceilings, measure_ceilings
from gpulab.core.device import DeviceInfo, detect
from gpulab.core.kernel_trace import (
    BACKWARD_FUNCTION_SCOPE,
    FORWARD_RANGE,
    GRAPH_LAUNCH,
    classify_kernel,
    device_kernel_records,
    is_python_frame,
    kernel_table,
    short_kernel_name,
)
from gpulab.core.timing import TimingSettings
from gpulab.mlp.ceilings import measure_gemm_ceilings
from gpulab.mlp.model import MLP, VARIANTS, MLPShape, ceiling_dtypes, gemm_shapes, matmul_flops, resolve_shape
from gpulab.mlp.profile import (
    MLP_KERNELS,
    MLP_OPS,
    MLP_SUMMARY,
    kernel_time_fields,
    make_step,
    prepare_step,
    profile_mlp,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "mlp"
REPO = Path(__file__).resolve().parent.parent


def _recorded_names() -> list[dict[str, str]]:
    with open(FIXTURES / "kernel_names.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("row", _recorded_names(), ids=lambda r: f"{r['vendor']}:{r['name'][:40]}")
def test_recorded_kernel_names_are_classified(row):
    assert classify_kernel(row["name"]) == row["expected"], row["source"]


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
         "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType))",
         "vectorized_elementwise_kernel<GeluCUDAKernelImpl>"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
         "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
         "float>, unsigned int, float, 4, 4>)", "reduce_kernel<MeanOps>"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_align1"
         "::Params)", "Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"),
        ("aten::addmm", "aten::addmm"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType"
         "<2u>, unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, int)",
         "CatArrayBatchedCopy<OpaqueType>"),
        ("triton_poi_fused_addmm_gelu_0", "triton_poi_fused_addmm_gelu_0"),
    ],
)
def test_short_kernel_names(name, short):
    assert short_kernel_name(name) == short


def test_triton_pointwise_kernel_named_after_addmm_is_not_a_matmul():
    # Inductor names fused kernels after every op they contain; the prefix says what the kernel is.
    assert classify_kernel("triton_poi_fused_addmm_gelu_0") == "activation"
    assert classify_kernel("triton_tem_fused_addmm_0") == "matmul"
    # cuBLAS's split-K epilogue is part of the GEMM even though its name says "reduce".
    assert classify_kernel("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>(float*)") == "matmul"


def test_python_frames_are_recognised():
    assert is_python_frame("torch/nn/modules/module.py(1751): _call_impl")
    assert is_python_frame("<built-in method mm of type object at 0x7f72e8>")
    assert is_python_frame("nn.Module: Linear_0")
    assert not is_python_frame("aten::mm")
    assert not is_python_frame("autograd::engine::evaluate_function: AddmmBackward0")


def _cpu_event(event_id, name, start, end, *, parent=None, scope=0, thread=1, annotation=False):
    from torch.autograd.profiler_util import FunctionEvent

    event = FunctionEvent(id=event_id, name=name, thread=thread, start_us=start, end_us=end, scope=scope,
                          is_user_annotation=annotation)
    if parent is not None:
        parent.append_cpu_child(event)
        event.set_cpu_parent(parent)
    return event


def _device_event(event_id, name, start, duration, *, annotation=False):
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    return FunctionEvent(id=event_id, name=name, thread=7, start_us=start, end_us=start + duration,
                         device_type=DeviceType.CUDA, is_user_annotation=annotation)


def test_device_kernels_get_phase_and_launching_op_and_annotations_are_dropped():
    gemm = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32_cublas"
    gelu = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int)"
    cijk = "Cijk_Alik_Bljk_SB_MT64x128x16_SN_1LDSB0_"
    fill = "__amd_rocclr_fillBufferAligned"
    # Forward on the main thread inside the step's range; backward on the autograd engine's device thread.
    forward = _cpu_event(1, FORWARD_RANGE, 0, 100, scope=7, annotation=True)
    addmm = _cpu_event(2, "aten::addmm", 10, 20, parent=forward)
    gelu_op = _cpu_event(3, "aten::gelu", 20, 30, parent=forward)
    node = _cpu_event(4, "autograd::engine::evaluate_function: AddmmBackward0", 200, 300, thread=2)
    backward_fn = _cpu_event(5, "AddmmBackward0", 201, 299, parent=node, scope=BACKWARD_FUNCTION_SCOPE, thread=2)
    mm = _cpu_event(6, "aten::mm", 210, 220, parent=backward_fn, thread=2)
    addmm.append_kernel(gemm, 0, 5.0)
    gelu_op.append_kernel(gelu, 0, 2.0)
    mm.append_kernel(cijk, 0, 7.0)
    forward.append_kernel(FORWARD_RANGE, 0, 50.0)  # the range as the GPU timeline mirrors it
    device = [
        _device_event(10, gemm, 12, 5.0),
        _device_event(11, gelu, 22, 2.0),
        _device_event(12, cijk, 212, 7.0),
        _device_event(13, FORWARD_RANGE, 10, 50.0, annotation=True),
        _device_event(14, fill, 400, 1.0),  # launched by nothing the profiler saw as an op
    ]
    records = device_kernel_records([forward, addmm, gelu_op, node, backward_fn, mm, *device])
    by_kernel = {r.kernel: r for r in records}
    assert set(by_kernel) == {gemm, gelu, cijk, fill}
    assert (by_kernel[gemm].phase, by_kernel[gemm].launched_by) == ("forward", "aten::addmm")
    assert by_kernel[gelu].phase == "forward"
    assert (by_kernel[cijk].phase, by_kernel[cijk].launched_by) == ("backward", "aten::mm")
    assert (by_kernel[fill].phase, by_kernel[fill].launched_by) == ("other", "")

    table = kernel_table(records, steps=1)
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.iloc[0]["kernel"] == cijk  # largest first
    categories = dict(zip(table["kernel"], table["category"], strict=True))
    assert categories == {gemm: "matmul", gelu: "activation", cijk: "matmul", fill: "other"}
    assert table["time_us"].sum() == pytest.approx(15.0)


def test_matmul_flops_match_pytorchs_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    shape = MLPShape(dim=24, num_layers=3, batch=5, num_steps=1)
    model = MLP(shape.dim, shape.num_layers)
    x = torch.randn(shape.batch, shape.dim)
    step = make_step(model, model, x, VARIANTS["fp32"], detect())
    with FlopCounterMode(display=False) as counter:
        step()
    assert counter.get_total_flops() == matmul_flops(shape) == 2 * 5 * 24 * 24 * (3 * 3 - 1)


def _device(backend: str) -> DeviceInfo:
    gpu = backend != "cpu"
    return DeviceInfo(backend=backend, torch_version="2.x", hip_version="6.4" if backend == "rocm" else None,
                      cuda_version="13.0" if backend == "cuda" else None, gpu_available=gpu,
                      reason="" if gpu else "PyTorch is a CPU-only build")


def test_auto_shape_scales_with_the_device():
    auto = {"dim": "auto", "num_layers": "auto", "batch": "auto", "num_steps": 5}
    assert resolve_shape(auto, _device("cuda")) == MLPShape(2048, 64, 1024, 5)
    assert resolve_shape(auto, _device("cpu")) == MLPShape(256, 4, 64, 5)
    assert resolve_shape({**auto, "dim": 512}, _device("cpu")).dim == 512
    with pytest.raises(ValueError, match=r"mlp\.num_steps"):
        resolve_shape({**auto, "num_steps": 0}, _device("cpu"))


def test_tf32_runs_on_cuda_only():
    tf32 = VARIANTS["tf32"]
    assert tf32.unavailable(_device("cuda")) is None
    assert "ROCm has no TF32" in tf32.unavailable(_device("rocm"))
    assert "no CUDA GPU" in tf32.unavailable(_device("cpu"))
    assert all(VARIANTS[v].unavailable(_device(b)) is None for v in ("fp32", "bf16", "compiled", "bf16_weights")
               for b in ("cuda", "rocm", "cpu"))


def test_graph_variants_need_a_gpu():
    for name in ("bf16_graph", "bf16_weights_graph"):
        assert "CUDA/HIP graphs need a GPU" in VARIANTS[name].unavailable(_device("cpu"))
    for name in ("bf16_graph", "bf16_weights_graph", "tf32_graph"):
        assert VARIANTS[name].unavailable(_device("cuda")) is None
    assert VARIANTS["bf16_graph"].unavailable(_device("rocm")) is None  # HIP graphs: tried, a refusal is recorded
    assert "ROCm has no TF32" in VARIANTS["tf32_graph"].unavailable(_device("rocm"))


def test_config_schema_and_default_config_list_every_variant():
    import yaml

    schema = yaml.safe_load((REPO / "src" / "gpulab" / "schemas" / "config.schema.yaml").read_text())
    variants = schema["properties"]["mlp"]["properties"]["variants"]
    assert variants["items"]["enum"] == list(VARIANTS)
    assert variants["default"] == list(VARIANTS)
    assert yaml.safe_load((REPO / "config.yaml").read_text())["mlp"]["variants"] == list(VARIANTS)


def test_host_bound_verdict_is_kernel_time_over_step_time():
    kernels = pd.DataFrame({"category": ["matmul", "activation"], "time_us": [3000.0, 1000.0]})
    device_bound = kernel_time_fields(kernels, steps=2, step_ms=2.2, info=_device("cuda"))
    assert device_bound["profiled_ms_per_step"] == pytest.approx(2.0)
    assert device_bound["kernel_step_share"] == pytest.approx(2.0 / 2.2)
    assert device_bound["matmul_share"] == pytest.approx(0.75)
    assert device_bound["host_bound"] is False
    assert kernel_time_fields(kernels, steps=2, step_ms=4.0, info=_device("cuda"))["host_bound"] is True
    on_cpu = kernel_time_fields(kernels, steps=2, step_ms=4.0, info=_device("cpu"))  # op self time: no verdict
    assert math.isnan(on_cpu["kernel_step_share"]) and on_cpu["host_bound"] is None
    no_kernels = kernel_time_fields(kernels.iloc[0:0], steps=2, step_ms=4.0, info=_device("cuda"))
    assert math.isnan(no_kernels["kernel_step_share"]) and no_kernels["host_bound"] is None


def test_kernels_no_op_launched_take_the_given_labels():
    # A graph replay's kernels reach the profiler without a launching op (seen on the H100).
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
    events = [_device_event(1, gemm, 10, 5.0), _device_event(2, gemm, 20, 5.0)]
    records = device_kernel_records(events, unlinked=("graph", GRAPH_LAUNCH))
    assert [(r.phase, r.launched_by) for r in records] == [("graph", GRAPH_LAUNCH)] * 2
    assert {r.phase for r in device_kernel_records(events)} == {"other"}


def test_the_checked_closure_is_the_timed_one_and_stale_results_do_not_pass():
    torch.manual_seed(0)
    model, x = MLP(16, 2), torch.randn(4, 16)
    prepared = prepare_step(VARIANTS["bf16_weights"], model, x, detect())
    assert prepared.model is not model and prepared.x.dtype == torch.bfloat16  # the variant's own bf16 copy
    prepared.run()
    assert prepared.output().dtype == torch.bfloat16 and prepared.grad().dtype == torch.bfloat16
    prepared.poison()  # what an earlier call left must not be checked as this call's result
    with pytest.raises(RuntimeError, match="not run"):
        prepared.output()
    with pytest.raises(RuntimeError, match="no gradient"):
        prepared.grad()


def test_strict_mode_expects_only_the_variants_the_backend_lacks(profiled):
    from gpulab.workflow.outcomes import table_outcomes

    summary = MLP_SUMMARY.read(profiled / "mlp" / "summary.csv")

    def judged(device):
        return {o.row for o in table_outcomes("mlp_profile", "mlp/summary.csv", summary, device) if not o.expected}

    assert "variant=bf16_graph" in judged(_device("rocm"))  # ROCm has HIP graphs: not running it is a failure
    assert "variant=tf32" not in judged(_device("rocm"))  # ROCm has no TF32: listed, expected
    assert "variant=tf32" in judged(_device("cuda"))


def test_the_mlp_measures_the_matmul_ceiling_at_its_own_gemms_only():
    shape = MLPShape(16, 1, 4, 1)
    assert ceiling_dtypes(["fp32", "tf32", "bf16_weights"]) == ["bf16", "fp32"]
    timing = TimingSettings(min_time_s=0.01, min_reps=3, warmup_reps=1, flush_cache=False)
    rows = measure_gemm_ceilings(["fp32"], gemm_shapes(shape), timing, target="t", fingerprint="f",
                                 device=_device("cpu"))
    table = CEILINGS.frame(rows)
    assert set(table["kind"]) == {"matmul"} and set(table["dtype"]) == {"fp32"}
    assert set(table["size"]) == {f"{m}x{n}x{k}" for m, n, k in gemm_shapes(shape)}  # no square of the ceilings job
    assert table["best"].sum() == 1 and Ceilings(table).matmul_tflops("fp32") > 0


def test_unknown_variant_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown variant"):
        profile_mlp({"variants": ["fp64"]}, TimingSettings(), target="t", fingerprint="f", ceilings=None,
                    out_dir=tmp_path)
    assert not list(tmp_path.iterdir())


TINY = {"dim": 32, "num_layers": 3, "batch": 16, "num_steps": 2,
        "variants": ["fp32", "tf32", "bf16", "compiled", "bf16_weights", "bf16_graph"]}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """One real CPU profile of a small MLP, the CPU's variants and two it skips, with ceilings measured here."""
    root = tmp_path_factory.mktemp("results") / "local"
    timing = TimingSettings(min_time_s=0.01, min_reps=3, warmup_reps=1, flush_cache=False)
    rows = measure_ceilings({"copy_mib": 1, "matmul_n": 128, "dtypes": ["fp32", "bf16"]}, timing,
                            target="local", fingerprint="test")
    CEILINGS.write(rows, root / "bench" / "ceilings.csv")
    # The MLP step's own: its GEMM shapes and its Linear layers on its path (as workflow/scripts/mlp_profile.py).
    shape = MLPShape(TINY["dim"], TINY["num_layers"], TINY["batch"], TINY["num_steps"])
    own = measure_gemm_ceilings(["fp32", "bf16"], gemm_shapes(shape), timing, target="local", fingerprint="test",
                                mlp=shape)
    CEILINGS.write(own, root / "mlp" / "ceilings.csv")
    ceilings = Ceilings(pd.concat([Ceilings.load(root / "bench" / "ceilings.csv").table,
                                   Ceilings.load(root / "mlp" / "ceilings.csv").table], ignore_index=True))
    profile_mlp(TINY, timing, target="local", fingerprint="test", ceilings=ceilings, out_dir=root / "mlp")
    return root


def test_cpu_profile_writes_every_artifact(profiled):
    mlp = profiled / "mlp"
    expected = {"summary.csv", "kernels.csv", "ops.csv"} | {
        f"{kind}_{v}.{ext}" for v in TINY["variants"] for kind, ext in (("trace", "json.gz"), ("stacks", "txt"))}
    assert expected <= {p.name for p in mlp.iterdir()}
    assert not [p for p in mlp.iterdir() if p.name.startswith(".")], "scratch files left behind"


def test_cpu_summary_rows(profiled):
    summary = MLP_SUMMARY.read(profiled / "mlp" / "summary.csv").set_index("variant")
    assert list(summary.index) == TINY["variants"]
    assert summary.loc["tf32", "status"] == "skipped"
    assert "TF32" in summary.loc["tf32", "reason"]
    assert summary.loc["bf16_graph", "status"] == "skipped"
    assert "graphs need a GPU" in summary.loc["bf16_graph", "reason"]
    ok = summary.loc[["fp32", "bf16", "compiled", "bf16_weights"]]
    assert (ok["status"] == "ok").all(), ok["reason"].to_dict()
    assert (ok["activities"] == "CPU").all() and (ok["time_source"] == "cpu_op_self").all()
    flops = matmul_flops(MLPShape(32, 3, 16, 2))
    assert (ok["step_matmul_flops"] == flops).all()
    expected_tflops = flops / (ok["median_ms"] / 1e3) / 1e12
    assert ok["tflops"].to_numpy() == pytest.approx(expected_tflops.to_numpy())
    assert ok["pct_of_ceiling"].to_numpy() == pytest.approx((100 * ok["tflops"] / ok["ceiling_tflops"]).to_numpy())
    assert (ok["rel_err_output"] <= ok["tolerance"]).all() and (ok["rel_err_grad"] <= ok["tolerance"]).all()
    assert ok.loc["bf16", "rel_err_output"] > ok.loc["fp32", "rel_err_output"]  # bf16 really ran in bf16
    assert ok["max_memory_allocated_bytes"].isna().all()  # no allocator statistics on CPU
    assert ok["kernel_step_share"].isna().all() and ok["host_bound"].isna().all()  # no device: no verdict
    assert (ok["matmul_share"] > 0).all() and (ok["matmul_share"] < 1).all()
    assert (ok["reps"] >= 3).all() and (ok["timer"] == "perf_counter").all()
    # No device energy counter on a CPU: unknown with the reason, never 0.
    assert ok["energy_j"].isna().all() and ok["tflop_per_j"].isna().all()
    assert ok["energy_reason"].str.startswith("unknown: no GPU").all()
    # Placed against the matmul ceiling of their dtype (its best method named) and judged like a benchmark row.
    assert ok["ceiling_method"].str.len().gt(0).all() and ok["above_ceiling"].notna().all()


def test_the_matmul_ceiling_includes_the_mlp_path(profiled):
    table = CEILINGS.read(profiled / "mlp" / "ceilings.csv")
    path = table[table["method"].str.startswith("linear stack fwd+bwd")].set_index("method")
    assert set(path.index) == {f"linear stack fwd+bwd, 3 layers ({v})" for v in ("fp32", "bf16", "bf16_weights")}
    assert (path["status"] == "ok").all() and (path["size"] == "16x32x32").all()
    # The stack does the step's products, the first layer's input gradient left out as the MLP's is.
    flops = matmul_flops(MLPShape(TINY["dim"], TINY["num_layers"], TINY["batch"], TINY["num_steps"]))
    assert path["tflops"].to_numpy() == pytest.approx(flops / (path["p10_ms"].to_numpy() / 1e3) / 1e12)


def test_cpu_kernel_rows_are_classified_by_phase_and_category(profiled):
    kernels = MLP_KERNELS.read(profiled / "mlp" / "kernels.csv")
    assert set(kernels["variant"]) == {"fp32", "bf16", "compiled", "bf16_weights"}
    for variant, rows in kernels.groupby("variant"):
        assert {"forward", "backward"} <= set(rows["phase"]), variant
        assert {"matmul", "activation"} <= set(rows["category"]), variant
        assert rows["share"].sum() == pytest.approx(1.0)
        assert not rows["launched_by"].fillna("").map(is_python_frame).any()
    fp32 = kernels[kernels["variant"] == "fp32"]
    phase_of = fp32.groupby("kernel")["phase"].agg(set)
    assert phase_of["aten::addmm"] == {"forward"} and phase_of["aten::mm"] == {"backward"}
    assert phase_of["aten::gelu_backward"] == {"backward"}
    compiled = kernels[kernels["variant"] == "compiled"]
    assert compiled["kernel"].str.contains("cpp_fused").any(), "Inductor's C++ kernels should be visible"


def test_cpu_ops_table_is_data(profiled):
    ops = MLP_OPS.read(profiled / "mlp" / "ops.csv")
    fp32 = ops[ops["variant"] == "fp32"].set_index("op")
    assert fp32.loc["aten::addmm", "calls"] == TINY["num_layers"] * TINY["num_steps"]
    assert fp32.loc[FORWARD_RANGE, "user_annotation"]
    assert not ops["op"].map(is_python_frame).any()


def test_cpu_traces_and_stacks(profiled):
    mlp = profiled / "mlp"
    for variant in ("fp32", "bf16", "compiled"):
        trace = json.loads(gzip.decompress((mlp / f"trace_{variant}.json.gz").read_bytes()))
        names = {e.get("name") for e in trace["traceEvents"]}
        assert FORWARD_RANGE in names and "aten::addmm" in names
        lines = (mlp / f"stacks_{variant}.txt").read_text().splitlines()
        assert lines and all(line.rsplit(" ", 1)[1].isdigit() for line in lines)
    skipped = json.loads(gzip.decompress((mlp / "trace_tf32.json.gz").read_bytes()))
    assert skipped["traceEvents"] == [] and skipped["otherData"]["gpulab_status"] == "skipped"
    assert (mlp / "stacks_tf32.txt").read_text() == ""


def test_report_section_renders(profiled, tmp_path):
    from gpulab.report.render import render_report

    results = tmp_path / "results"
    shutil.copytree(profiled, results / "local")
    report = render_report(results, tmp_path / "report.html", {"report": {"title": "t"}}, "pytest")
    assert not report.errors
    assert "mlp" in [s["id"] for s in report.sections]
    html = (tmp_path / "report.html").read_text()
    section = html[html.index('<section id="mlp"'):]
    section = section[: section.index("</section>")]
    assert "ui.perfetto.dev" in section and "chrome://tracing" in section
    assert 'href="results/local/mlp/trace_fp32.json.gz"' in section
    assert "CPU activities only" in section
    assert section.count("<img") == 4  # step time, TFLOP/s, top kernels, category shares
    assert "TF32 is a CUDA matmul mode; this target has no CUDA GPU" in section  # the skipped row says why


def test_a_variant_that_breaks_is_recorded_not_raised(tmp_path):
    # No working C++ compiler is the realistic way the compiled variant fails on a bare CPU host.
    import torch._inductor.config as inductor_config

    # Inductor's own patch, not monkeypatch: monkeypatch's undo deletes a config entry (fx_graph_cache then "does
    # not exist" for every later compile of the test run).
    config = {**TINY, "dim": 40, "variants": ["compiled", "fp32"]}
    with inductor_config.patch({"cpp.cxx": (str(tmp_path / "no-such-cxx"),), "fx_graph_cache": False}):
        summary = profile_mlp(config, TimingSettings(min_time_s=0.01, min_reps=3, warmup_reps=1, flush_cache=False),
                              target="local", fingerprint="test", ceilings=None, out_dir=tmp_path)
    rows = summary.set_index("variant")
    assert rows.loc["compiled", "status"] == "failed"
    assert "compiler" in rows.loc["compiled", "reason"].lower()
    assert rows.loc["fp32", "status"] == "ok"
    assert math.isnan(rows.loc["fp32", "ceiling_tflops"])
    trace = json.loads(gzip.decompress((tmp_path / "trace_compiled.json.gz").read_bytes()))
    assert trace["otherData"]["gpulab_status"] == "failed"
    assert set(pd.read_csv(tmp_path / "kernels.csv")["variant"]) == {"fp32"}


def test_a_variant_that_fails_its_check_is_incorrect_and_neither_timed_nor_profiled(tmp_path, monkeypatch):
    import dataclasses

    import gpulab.mlp.profile as profile

    # bf16 arithmetic against a bound only fp64 could meet: the real check on the real step must fail.
    monkeypatch.setitem(profile.VARIANTS, "bf16", dataclasses.replace(VARIANTS["bf16"], tolerance=1e-12))
    config = {**TINY, "variants": ["bf16", "fp32"]}
    summary = profile_mlp(config, TimingSettings(min_time_s=0.01, min_reps=3, warmup_reps=1, flush_cache=False),
                          target="local", fingerprint="test", ceilings=None, out_dir=tmp_path)
    rows = summary.set_index("variant")
    bad = rows.loc["bf16"]
    assert bad["status"] == "incorrect"
    assert "exceeds 1e-12" in bad["reason"]
    assert bad["rel_err_output"] > 1e-12  # the measured errors are kept
    assert pd.isna(bad["median_ms"]) and pd.isna(bad["tflops"]) and pd.isna(bad["profiled_ms_per_step"])
    assert rows.loc["fp32", "status"] == "ok"
    assert set(pd.read_csv(tmp_path / "kernels.csv")["variant"]) == {"fp32"}
    assert set(pd.read_csv(tmp_path / "ops.csv")["variant"]) == {"fp32"}
    trace = json.loads(gzip.decompress((tmp_path / "trace_bf16.json.gz").read_bytes()))
    assert trace["otherData"]["gpulab_status"] == "incorrect"


def test_h100_report_says_which_variants_are_host_bound(tmp_path):
    """The H100 run (fixtures/mlp/README.md): the report's table gives kernel time over step time per variant
    and says host-bound exactly where that share is under 80%."""
    from gpulab.report.render import render_report

    summary = MLP_SUMMARY.read(FIXTURES / "h100" / "mlp" / "summary.csv")
    shutil.copytree(FIXTURES / "h100" / "mlp", tmp_path / "results" / "h100" / "mlp")
    report = render_report(tmp_path / "results", tmp_path / "report.html", {"report": {"title": "t"}}, "pytest")
    assert not report.errors
    html = (tmp_path / "report.html").read_text()
    section = html[html.index('<section id="mlp"'):]
    section = section[: section.index("</section>")]
    table = _first_table(section[section.rindex("<table", 0, section.index(">bound</th>")):]).set_index("variant")
    assert sorted(table.index) == sorted(summary["variant"])
    shares = (summary.set_index("variant")["kernel_step_share"] * 100).reindex(table.index)
    shown = table["kernel time / step time (%)"].astype(float).to_numpy()
    assert shown == pytest.approx(shares.to_numpy(), rel=1e-2)
    expected = ["host-bound" if share < 80 else "device" for share in shares]
    assert list(table["bound"]) == expected
    assert "host-bound" in expected and "device" in expected


def _first_table(html: str) -> pd.DataFrame:
    """The first <table> of an HTML fragment as text cells (header row from <th>)."""
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None
            self.done = False

        def handle_starttag(self, tag, attrs):
            if self.done:
                return
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None and not self.done:
                self.rows[-1].append("".join(self.cell).strip())
                self.cell = None
            elif tag == "table":
                self.done = True

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    parser = Cells()
    parser.feed(html[html.index("<table"):])
    header, *body = [r for r in parser.rows if r]
    return pd.DataFrame(body, columns=header)
