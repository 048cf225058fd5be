"""The report: reading results defensively, comparisons, figures, rendering and the ``gpulab`` command.

Results used here are the test fixtures in ``tests/fixtures/report/`` (see its README: a recorded CPU
run of this workflow, plus a second target derived from it with synthetic numbers, clearly labelled).
"""

from __future__ import annotations

import atexit
import base64
import functools
import io
import json
import math
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest
from PIL import Image
from report_fixtures import (
    CONFIG,
    FIXTURE_RESULTS,
    SYNTHETIC_TARGET,
    comparison_report,
    cpu_report,
    make_results,
    make_run_pair,
    two_target_report,
)

from gpulab.cli import main as gpulab_main
from gpulab.report import findings, formats, plots
from gpulab.report.compare import (
    SLOWER,
    STATUS_CHANGED,
    cross_target_ratios,
    env_differences,
    with_throughput,
)
from gpulab.report.render import (
    SIZE_BUDGET_BYTES,
    ReportError,
    discover_sections,
    format_number,
    render_report,
)
from gpulab.report.results import ResultsIndex, key_columns

# ------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize(("value", "text"), [
    (None, "–"), (math.nan, "–"), (0.0, "0"), (3, "3"), (16777216, "16,777,216"), (2870.4, "2,870"),
    (12.345, "12.3"), (0.01234, "0.0123"), (4.2e-7, "4.20e-07"), (True, "true"),
])
def test_numbers_are_formatted_for_readers(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize(("size", "dtype", "text"), [
    ("268435456", "fp32", "1 GiB · 268,435,456 fp32"), ("98432", "bf16", "192 KiB · 98,432 bf16"),
    ("4096x16384", "bf16", "128 MiB · 4096 × 16384 bf16"), ("1823x781", "fp32", "5.43 MiB · 1823 × 781 fp32"),
])
def test_a_size_is_written_one_way_bytes_then_elements(size, dtype, text):
    assert formats.size_words(size, dtype) == text


@pytest.mark.parametrize(("method", "text"), [
    ("triton b8192 w8", "Triton kernel, 8,192-element blocks, 8 warps"),
    ("gelu triton (fastest row; above every method)", "the gelu triton row itself, faster than every method"),
    ("memcpy (graph replay)", "memcpy replayed from a device graph"), ("torch.neg", "torch.neg (elementwise negation)"),
])
def test_ceiling_methods_read_as_words(method, text):
    assert formats.method_words(method) == text


def test_times_carry_their_unit():
    assert [formats.milliseconds(v) for v in (0.0123, 4.03, 1200.0, math.nan)] == ["12.3 µs", "4.03 ms", "1.2 s", "–"]


def test_the_title_names_the_platforms_measured_gpus_first():
    h100 = {"name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "gpu_available": True}
    cpu = {"name": "AMD EPYC", "backend": "cpu", "gpu_available": False}
    assert formats.platforms_title({"cpu": cpu, "h100": h100}) == "gpulab: NVIDIA H100 80GB HBM3 and CPU"
    assert formats.platforms_title({"cpu": cpu}) == "gpulab: CPU"
    assert formats.platforms_title({}) == "gpulab report"
    html = cpu_report()
    assert "<title>gpulab: CPU</title>" in html and "ROCm/HIP" not in html[:html.index("</header>")]


# ------------------------------------------------------------------------------------- run deltas


# Per-cell verdicts of two runs: tests/test_compare.py.


def test_env_differences_list_what_changed_but_not_the_capture_time():
    a = {"captured_at": "x", "packages": {"torch": "2.4.0"}, "device": {"name": "MI300X"}}
    b = {"captured_at": "y", "packages": {"torch": "2.5.0"}, "device": {"name": "MI300X"}}
    diff = env_differences(a, b)
    assert diff.to_dict("records") == [{"key": "packages.torch", "baseline": "2.4.0", "this run": "2.5.0"}]


# ------------------------------------------------------------------------------ target ratios


def _bench(target, impl, size, gbps, status="ok", dtype="fp32"):
    return {"target": target, "op": "gelu", "impl": impl, "dtype": dtype, "size": str(size), "numel": size,
            "gbps": gbps, "status": status, "median_ms": 1.0, "p10_ms": 0.9, "p90_ms": 1.1}


def test_ratios_compare_the_same_cell_and_skip_cells_not_ok_on_both():
    df = pd.DataFrame([
        _bench("amd", "native", 1024, 100.0), _bench("nv", "native", 1024, 250.0),
        _bench("amd", "triton", 1024, 100.0), _bench("nv", "triton", 1024, 900.0, status="incorrect"),
    ])
    table = cross_target_ratios(df, value="gbps", baseline="amd")
    assert table is not None and table.matched_on == "same cell"
    frame = table.frame.set_index("impl")
    assert frame.loc["native", "nv vs amd (×)"] == pytest.approx(2.5)
    assert math.isnan(frame.loc["triton", "nv vs amd (×)"])


def test_ratios_fall_back_to_each_targets_largest_size_when_sizes_differ():
    df = pd.DataFrame([
        _bench("cpu", "native", 1 << 20, 10.0), _bench("cpu", "native", 1 << 22, 12.0),
        _bench("gpu", "native", 1 << 26, 2000.0), _bench("gpu", "native", 1 << 28, 2900.0),
    ])
    table = cross_target_ratios(df, value="gbps", baseline="cpu")
    assert table is not None and table.matched_on == "largest size each target ran"
    row = table.frame.iloc[0]
    assert row["gpu vs cpu (×)"] == pytest.approx(2900.0 / 12.0)
    assert row["size (cpu)"] == str(1 << 22) and row["size (gpu)"] == str(1 << 28)


def test_rows_measuring_different_things_are_compared_on_their_own_throughput():
    ceilings = pd.DataFrame([
        {"target": t, "status": "ok", "kind": kind, "dtype": "fp32", "size": size, "gbps": gbps, "tflops": tflops}
        for t, scale in (("cpu", 1.0), ("gpu", 100.0))
        for kind, size, gbps, tflops in (("copy", 64 << 20 if t == "cpu" else 1 << 30, 10.0 * scale, math.nan),
                                         ("matmul", 1024 if t == "cpu" else 8192, math.nan, 0.05 * scale))
    ])
    frame, value = with_throughput(ceilings)
    table = cross_target_ratios(frame, value=value, baseline="cpu")
    assert table is not None and value == "throughput (gbps | tflops)"
    assert sorted(table.frame["kind"]) == ["copy", "matmul"]  # neither kind is lost to the other
    assert table.frame["gpu vs cpu (×)"].tolist() == pytest.approx([100.0, 100.0])


def test_time_ratios_read_as_speed_up():
    df = pd.DataFrame([
        {"target": "a", "variant": "fp32", "median_ms": 10.0, "status": "ok"},
        {"target": "b", "variant": "fp32", "median_ms": 2.0, "status": "ok"},
    ])
    table = cross_target_ratios(df, value="median_ms", baseline="a", higher_is_better=False)
    assert table is not None
    assert table.frame["b vs a (×)"].iloc[0] == pytest.approx(5.0)


def test_key_columns_grow_until_rows_are_unique():
    kernels = pd.DataFrame({"target": ["t", "t"], "variant": ["fp32", "fp32"], "kernel": ["gemm", "gelu"],
                            "phase": ["forward", "forward"], "time_us": [1.0, 2.0]})
    keys = key_columns(kernels)
    assert {"variant", "target", "kernel"} <= set(keys) and "time_us" not in keys
    assert not kernels.duplicated(subset=keys).any()
    # The GPU's state around a row names no cell: two runs' ceilings match whatever the clocks were.
    ceilings = pd.DataFrame({"target": "t", "kind": "copy", "dtype": "fp32", "size": "1024",
                             "method": ["memcpy", "torch.neg"], "gpu_before": ['{"sm_mhz": 1980}', '{"sm_mhz": 1755}'],
                             "gpu_after": "{}", "throttled": "no", "gbps": [1.0, 2.0]})
    assert key_columns(ceilings) == ["dtype", "size", "kind", "target", "method"]


# ----------------------------------------------------------------------------- results index


def test_results_index_records_unreadable_files_and_labels_rows_by_directory(tmp_path):
    (tmp_path / "h100-copy" / "bench").mkdir(parents=True)
    pd.DataFrame([_bench("h100", "native", 1024, 5.0)]).to_csv(tmp_path / "h100-copy/bench/gelu.csv", index=False)
    (tmp_path / "h100-copy/bench/softmax.csv").write_bytes(b'a,b\n1,"unterminated\n')
    (tmp_path / "h100-copy/env").mkdir()
    (tmp_path / "h100-copy/env/env.json").write_text("{not json")
    index = ResultsIndex(tmp_path)
    assert index.table("bench/gelu.csv")["target"].tolist() == ["h100-copy"]
    assert index.table("bench/softmax.csv").empty
    assert index.env("h100-copy") is None
    messages = {p.path: p.message for p in index.problems}
    assert "unreadable table" in messages["h100-copy/bench/softmax.csv"]
    assert "unreadable environment capture" in messages["h100-copy/env/env.json"]


def test_logs_of_an_artifact_are_its_writers_or_for_an_aggregate_those_of_the_rows_cells(tmp_path):
    rule_outputs = {"kernels_compile": ["results/{target}/build/kernels/{arch}.csv"],
                    "kernels_aggregate": ["results/{target}/build/kernel_resources.csv"],
                    "extension_build": ["results/{target}/build/extension.csv"],
                    "bench_cell": ["results/{target}/bench/cells/{op}__{impl}.csv"],
                    "bench_aggregate": ["results/{target}/bench/{op}.csv"],
                    "llm_model_fetch": ["results/{target}/llm/models/{model}.json"],
                    "llm_infer": ["results/{target}/llm/{model}__hf.csv", "results/{target}/llm/{model}__fast.csv"],
                    "env_capture": []}
    jobs = {  # job: (rule, wildcards, inputs), as Snakemake's benchmark records hold them; the run's target: local
        "kernels_compile_gfx1151": ("kernels_compile", {"arch": "gfx1151"}, []),
        "kernels_compile_sm_90": ("kernels_compile", {"arch": "sm_90"}, []),
        "kernels_aggregate": ("kernels_aggregate", {}, ["build/kernels/gfx1151.csv", "build/kernels/sm_90.csv"]),
        "extension_build": ("extension_build", {}, []),
        "bench_cell_gelu__triton": ("bench_cell", {"op": "gelu", "impl": "triton"}, ["build/extension.csv"]),
        "bench_cell_gelu__native": ("bench_cell", {"op": "gelu", "impl": "native"}, []),
        "bench_aggregate_gelu": ("bench_aggregate", {"op": "gelu"},
                                 ["bench/cells/gelu__triton.csv", "bench/cells/gelu__native.csv"]),
        "llm_model_fetch_tiny": ("llm_model_fetch", {"model": "tiny"}, []),
        "llm_infer_tiny": ("llm_infer", {"model": "tiny"}, ["llm/models/tiny.json"]),
    }
    for sub in ("logs", "benchmarks"):
        (tmp_path / "t" / sub).mkdir(parents=True)
    for job, (rule, wildcards, inputs) in jobs.items():
        (tmp_path / f"t/logs/{job}.log").write_text("")
        record = {"rule_name": rule, "wildcards": {**wildcards, "target": "local"}, "s": 1.0,
                  "input_size_mb": {f"results/local/{p}": 0.1 for p in inputs}}
        (tmp_path / f"t/benchmarks/{job}.jsonl").write_text(json.dumps(record) + "\n")
    index = ResultsIndex(tmp_path)

    def logs(artifact, **row):
        return [p.stem for p in index.logs_for("t", artifact, pd.DataFrame([row]), rule_outputs)]

    # Not extension_build's or anything else named "build": the compile job of the failing rows' architecture.
    assert logs("build/kernel_resources.csv", arch="gfx1151", op="gelu") == ["kernels_compile_gfx1151"]
    assert logs("bench/gelu.csv", op="gelu", impl="triton") == ["bench_cell_gelu__triton"]
    assert logs("build/extension.csv", op="gelu") == ["extension_build"]
    # The model fetch is a prerequisite of the LLM table, not one of its cells.
    assert logs("llm/tiny__hf.csv", model="tiny", engine="hf") == ["llm_infer_tiny"]  # one job, every engine
    assert index.logs_for("t", "bench/gelu.csv", pd.DataFrame([{"op": "gelu"}]), {}) == []  # no rule outputs


def test_llm_headline_is_decode_of_the_studys_model_not_prefill_or_the_tiny_model(tmp_path):
    from gpulab.llm.bench import LLM
    from gpulab.report.sections.summary import llm_headline

    def row(model, source, engine, test, tok_s, pct=math.nan, status="ok"):
        return {"target": "t", "fingerprint": "f", "status": status, "model": model, "model_source": source,
                "engine": engine, "test": test, "tok_s": tok_s, "pct_of_ceiling": pct}

    LLM.write([row("tiny", "tiny", "fast", "tg128", 900.0, 40.0), row("tiny", "tiny", "fast", "pp512", 9000.0)],
              tmp_path / "t/llm/tiny__fast.csv")
    LLM.write([row("random:Qwen/Qwen2.5-7B-Instruct", "random", "hf", "tg128", 11.1, 5.6),
               row("random:Qwen/Qwen2.5-7B-Instruct", "random", "hf", "pp512", 2500.0)],
              tmp_path / "t/llm/qwen__hf.csv")
    LLM.write([row("random:Qwen/Qwen2.5-7B-Instruct", "random", "fast", "tg128", 160.0, 81.0),
               row("random:Qwen/Qwen2.5-7B-Instruct", "random", "fast", "tg128", 999.0, status="incorrect")],
              tmp_path / "t/llm/qwen__fast.csv")
    headline = llm_headline(ResultsIndex(tmp_path), "t")
    assert (headline.value, headline.pct) == (160.0, 81.0)
    assert "fast" in headline.detail and "Qwen2.5-7B" in headline.detail
    assert not llm_headline(ResultsIndex(tmp_path), "absent").measured


def test_llm_energy_figure_has_a_panel_per_target_and_model_with_power_guides(monkeypatch):
    """Energy against time: one panel per (target, model), the engines by colour and the tests by marker in two
    legends (no point labels to overlap), dotted constant-power guides labelled in watts; rows without a known
    energy are left out, and with none the figure is not drawn."""
    from gpulab.report.sections.llm import _energy_figure

    def row(target, engine, test, ms, joules):
        return {"target": target, "model": "m", "status": "ok", "engine": engine, "test": test, "mean_ms": ms,
                "energy_j": joules}

    df = pd.DataFrame([row("h100", "fast", "pp512", 11.0, 7.7), row("h100", "fast", "tg128", 700.0, 420.0),
                       row("h100", "hf", "study", 40_000.0, 6_000.0), row("h100", "hf", "ttft512", 27.0, math.nan),
                       row("h200", "fast", "tg128", 480.0, 340.0), row("h200", "fast", "pp512", 10.4, 7.2)])
    drawn = {}
    real_embed = plots.embed

    def keep(fig, *args, **kwargs):
        drawn["axes"] = [ax for ax in fig.axes if ax.get_visible()]
        drawn["legends"] = [legend.get_title().get_text() for legend in fig.legends]
        drawn["texts"] = [t.get_text() for ax in drawn["axes"] for t in ax.texts]
        return real_embed(fig, *args, **kwargs)

    monkeypatch.setattr(plots, "embed", keep)
    figure = _energy_figure(df)
    assert [ax.get_title() for ax in drawn["axes"]] == ["h100 · m", "h200 · m"]
    assert drawn["legends"] == ["engine", "test"]
    assert drawn["texts"] and all(re.fullmatch(r"\d+ W", t) for t in drawn["texts"])
    assert len(figure.data) == 5 and figure.data["energy_j"].notna().all()
    assert figure.smallest_text_pt >= plots.SMALL_PT
    assert _energy_figure(df.assign(energy_j=math.nan)) is None


def test_gelu_headline_says_when_its_row_set_the_ceiling_it_is_placed_against():
    """On the H100 the best GeLU row's size has a ceiling a benchmarked row set by beating every copy method (in the
    recorded run, softmax's torch.compile row of the same bytes): the copy card beside it shows less, so the card
    names the row that set it."""
    from gpulab.report.sections.summary import gelu_headline

    bench = Path(__file__).parent / "fixtures" / "bench"
    headline = gelu_headline(ResultsIndex(bench), "h100")
    table = pd.read_csv(bench / "h100/bench/gelu.csv")
    best = table.loc[table["gbps"].idxmax()]
    assert headline.value == pytest.approx(best["gbps"]) and not headline.pct > 100.0
    if "fastest row" in best["ceiling_method"]:
        setter = best["ceiling_method"].split(" (")[0]
        if setter == f"{best['op']} {best['impl']}":  # its own ceiling: no percentage of it, the methods' figure
            assert math.isnan(headline.pct) and headline.pct_of.startswith("fastest measured; ceiling methods reached")
        else:
            assert headline.pct_of.startswith(f"the ceiling at its size, which the {setter} row of its bytes set")
        assert f"{best['dedicated_ceiling_gbps']:,.0f} GB/s" in headline.pct_of
    else:
        assert headline.pct_of == "measured copy ceiling (1 read + 1 write)"


def test_no_verdict_judges_a_row_against_the_ceiling_it_set(tmp_path):
    """Where the fastest row beat every ceiling method at its size it set its own ceiling: the verdict, the summary's
    card and its sentence say so with the methods' figure and rank by GB/s, never "100% of the ceiling"."""
    from gpulab.report.sections.summary import gelu_headline

    shutil.copytree(Path(__file__).parent / "fixtures" / "bench" / "h100", tmp_path / "results" / "h100")
    path = tmp_path / "results" / "h100" / "bench" / "gelu.csv"
    table = pd.read_csv(path)
    best = table["gbps"].idxmax()
    own = f"gelu {table.loc[best, 'impl']} {findings.OWN_CEILING}"
    table.loc[best, ["ceiling_method", "ceiling_gbps", "pct_of_ceiling"]] = [own, table.loc[best, "gbps"], 100.0]
    table.to_csv(path, index=False)
    methods = f"{table.loc[best, 'dedicated_ceiling_gbps']:,.0f} GB/s"
    assert gelu_headline(ResultsIndex(tmp_path / "results"), "h100").pct_of == \
        f"fastest measured; ceiling methods reached {methods}"
    assert findings.op_verdict(table, "gelu")["own_cells"] >= 1
    html = render_report(tmp_path / "results", tmp_path / "r.html", CONFIG, "pytest").path.read_text()
    verdict = _words(_section_text(html, "verdict"))
    line = verdict[verdict.index("gelu " + table.loc[best, "impl"]):][:400]
    assert f"fastest measured; ceiling methods reached {methods}" in line and "100%" not in line.split("ranked")[0]
    assert "ranked: " + table.loc[best, "impl"] in line
    assert "fastest thing measured at its size" in _words(_section_text(html, "summary"))


def test_gelu_headline_names_the_reference_timed_beside_its_row_when_that_set_the_ceiling(tmp_path):
    """On a CPU the best GeLU row may be placed against the memcpy timed beside it, which the copy card (the
    ceilings job's plateau) does not show: the card gives that figure, so its percentage can be checked."""
    from gpulab.report.sections.summary import gelu_headline

    table = pd.read_csv(Path(__file__).parent / "fixtures" / "bench" / "local/bench/gelu.csv")
    best = table["gbps"].idxmax()
    # The recorded run's best row was placed against the ceilings job's torch.neg; as if its reference had won:
    table.loc[best, ["ceiling_method", "ceiling_gbps", "dedicated_ceiling_gbps"]] = [
        "memcpy (timed beside the case)", 25.04, 25.04]
    table.loc[best, "pct_of_ceiling"] = 100 * table.loc[best, "gbps"] / 25.04
    (tmp_path / "local" / "bench").mkdir(parents=True)
    table.to_csv(tmp_path / "local" / "bench" / "gelu.csv", index=False)
    headline = gelu_headline(ResultsIndex(tmp_path), "local")
    assert headline.pct_of == "measured copy ceiling (1 read + 1 write): 25.0 GB/s, memcpy (timed beside the case)"
    assert headline.pct == pytest.approx(table.loc[best, "pct_of_ceiling"], abs=0.1)


def test_environment_draws_each_backends_stack_in_its_layers(tmp_path, fixtures):
    """The recorded H100 ldd (CUDA) beside the study's ROCm ldd: runtimes side by side, HSA only on ROCm."""
    from gpulab.env.runtime_stack import RUNTIME_STACK, stack_rows
    from gpulab.report.render import ReportContext, environment
    from gpulab.report.sections import environment as env_section

    torch_lib = {"h100": "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib",
                 "rocm": "/opt/venv/lib/python3.13/site-packages/torch/lib"}
    listings = {"h100": [("libtorch_cuda.so", "ldd_libtorch_cuda_h100.txt"),
                         ("libtorch_python.so", "ldd_libtorch_python_h100.txt")],
                "rocm": [("libtorch_python.so", "ldd_libtorch_python_rocm_study.txt")]}
    for target, backend in (("h100", "cuda"), ("rocm", "rocm")):
        rows = stack_rows([(lib, (fixtures / "env" / name).read_text()) for lib, name in listings[target]],
                          torch_lib[target])
        RUNTIME_STACK.write([{"target": target, "fingerprint": "f", "status": "ok", **r} for r in rows],
                            tmp_path / target / "env/runtime_stack.csv")
        env = {"fingerprint": "f", "target": target, "device": {"backend": backend, "name": target.upper(),
                                                                 "gpu_available": True}}
        (tmp_path / target / "env/env.json").write_text(json.dumps(env))
    ctx = ReportContext(ResultsIndex(tmp_path), tmp_path / "report.html", CONFIG, "pytest")
    data = env_section.build(ctx)
    layers = {t["name"]: t["layers"] for t in data["targets"]}
    names = {t: {layer: [lib["name"] for lib in info["libraries"]] for layer, info in ls.items()}
             for t, ls in layers.items()}
    assert any(n.startswith("libcudart") for n in names["h100"]["gpu_runtime"])
    assert any(n.startswith("libcublas") for n in names["h100"]["math"])
    assert layers["h100"]["hsa_runtime"]["absent"] and "ROCm" in layers["h100"]["hsa_runtime"]["why"]
    assert names["rocm"]["gpu_runtime"] == ["libamdhip64.so.7"] and names["rocm"]["hsa_runtime"]
    html = environment().get_template(env_section.TEMPLATE).render(ctx=ctx, **data)
    assert html.count('class="stack-grid cols-2"') == 1  # one grid, a column per target
    assert "vendor-nvidia" in html and "vendor-amd" in html


# ---------------------------------------------------------------------------------- figures


def _decode(figure: plots.Figure) -> Image.Image:
    assert figure.uri.startswith("data:image/png;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(figure.uri.split(",", 1)[1])))
    image.load()
    return image


def test_metric_vs_size_draws_one_panel_per_target_and_keeps_every_row_as_data():
    plots.apply_style()
    df = pd.DataFrame([_bench(t, impl, n, g * (3 if t == "b" else 1), status="incorrect" if impl == "triton" and
                              n == 4096 else "ok")
                       for t in ("a", "b") for impl in ("native", "triton") for n, g in ((1024, 10.0), (4096, 20.0))])
    single = plots.metric_vs_size(df[df["target"] == "a"], x="numel", y="gbps", hue="impl", xlabel="elements",
                                  ylabel="GB/s", alt="one target")
    double = plots.metric_vs_size(df, x="numel", y="gbps", hue="impl", xlabel="elements", ylabel="GB/s",
                                  alt="two targets", ceilings={"a": {"copy": 25.0}, "b": {"copy": 70.0}})
    assert _decode(double).width > _decode(single).width  # side by side, not overlaid
    assert len(double.data) == len(df)  # the incorrect row is not plotted but stays in the table
    grid = plots.metric_vs_size(df, x="numel", y="gbps", hue="impl", xlabel="elements", ylabel="GB/s",
                                alt="targets by dtype", row="target", col="dtype",
                                ceilings={("a", "fp32"): {"copy": 25.0}, "b": {"copy": 70.0}})
    assert _decode(grid).height > _decode(double).height * 1.6  # one row of panels per target
    assert (double.width, double.height) == (round(_decode(double).width * 100 / plots.DPI),
                                             round(_decode(double).height * 100 / plots.DPI))


def test_panels_share_a_scale_only_when_their_values_are_comparable():
    amd_nv = pd.DataFrame({"target": ["mi300x", "h100"], "tflops": [600.0, 700.0]})
    cpu_gpu = pd.DataFrame({"target": ["cpu", "h100"], "tflops": [0.006, 700.0]})
    assert plots._share_y(amd_nv, "tflops", "target")
    assert not plots._share_y(cpu_gpu, "tflops", "target")


def test_series_keep_their_colour_whatever_else_is_plotted():
    assert plots.series_colors(["triton"])["triton"] == plots.series_colors(["native", "manual", "triton"])["triton"]
    assert plots.series_order(["triton", "zeta", "native"]) == ["native", "triton", "zeta"]


def test_ratio_heatmap_and_strip_render():
    plots.apply_style()
    df = pd.DataFrame({"target": ["a"] * 4, "impl": ["triton", "manual"] * 2, "dtype": ["fp32"] * 2 + ["bf16"] * 2,
                       "speedup": [1.2, 0.3, 1.1, 0.25]})
    heat = plots.ratio_heatmap(df, index="dtype", columns="impl", values="speedup", alt="heat", label="× native")
    strip = plots.ratio_strip(df, ratio="speedup", row="impl", alt="strip", xlabel="× native")
    assert _decode(heat).height > 50 and _decode(strip).width > 100


# --------------------------------------------------------------------------------- rendering


def test_sections_follow_the_declared_order():
    orders = {m.ID: m.ORDER for m in discover_sections()}
    assert orders["summary"] == 10 and orders["environment"] == 20 and orders["methodology"] == 90
    assert list(orders.values()) == sorted(orders.values())


def test_no_html_is_assembled_in_python():
    tag = re.compile(r"""["'][^"'\n]*<\s*/?\s*(div|table|tr|td|th|span|p|img|h[1-6]|ul|li|a|details|section|br)\b""")
    report_package = Path(plots.__file__).parent
    offenders = [f"{path.name}:{n}" for path in report_package.rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if tag.search(line)]
    assert offenders == []


def test_two_target_report_is_self_contained_and_complete():
    rendered = two_target_report()
    html = rendered.path.read_text()
    assert rendered.errors == []
    titles = [s["title"] for s in rendered.sections]
    assert titles[:3] == ["Verdict", "Summary", "Environment & runtime stack"]
    assert "Comparison across targets" in titles and titles[-1] == "Methodology & reproduction"
    assert rendered.size_bytes < SIZE_BUDGET_BYTES
    # One inline script, which opens folded detail for a link into it and for printing; it loads nothing.
    assert html.count("<script") == 1 and "<script>" in html and "fetch(" not in html
    # Links a reader may follow are fine; nothing the page itself loads may come from elsewhere.
    sources = re.findall(r"""\ssrc=["']([^"']*)""", html)
    assert sources and all(src.startswith("data:image/png;base64,") for src in sources), "every image is embedded"
    assert not re.search(r"""<link[^>]*href=""", html) and "@import" not in html and "url(" not in html
    assert SYNTHETIC_TARGET in html and "synthetic" in html.lower()
    # Every measured artifact present on both targets gets a ratio table; the synthetic target is 20x.
    assert "bench/gelu.csv" in html and f"{SYNTHETIC_TARGET} vs cpu (×)" in html
    across = html[html.index('id="across-targets"'):html.index('id="methodology"')]
    assert "<td>20</td>" in across and "largest size" not in across  # same cells on both: compared directly


def test_summary_shows_headlines_and_links_each_problem_to_its_log():
    html = two_target_report().path.read_text()
    summary = html[html.index('id="summary"'):html.index('id="environment"')]
    for label in ("Best GeLU bandwidth", "MLP fwd+bwd step", "Copy bandwidth (ceiling)"):
        assert label in summary
    assert "Targets side by side" in summary
    links = re.findall(r'href="([^"]+\.log)"', summary)
    assert links and all((two_target_report().path.parent / link).is_file() for link in links)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_broken_section_is_shown_not_fatal_unless_strict(tmp_path, monkeypatch, workers):
    import gpulab.report.render as render
    import gpulab.report.sections.methodology as methodology
    import gpulab.report.sections.summary as summary

    results = make_results(tmp_path)
    monkeypatch.setattr(render, "discover_sections", lambda: [summary, methodology])

    def broken(_ctx):
        raise KeyError("column 'gbps' missing")

    monkeypatch.setattr(methodology, "build", broken)
    rendered = render_report(results, tmp_path / "report.html", CONFIG, "pytest", workers=workers)
    assert [e["id"] for e in rendered.errors] == ["methodology"]
    html = rendered.path.read_text()
    assert "column &#39;gbps&#39; missing" in html and 'href="#methodology"' in html
    with pytest.raises(ReportError, match="methodology"):
        render_report(results, tmp_path / "strict.html", {**CONFIG, "strict": True}, "pytest", workers=workers)
    assert not (tmp_path / "strict.html").exists()


def test_sections_rendered_in_forked_workers_give_the_same_page_and_its_problems(tmp_path):
    """Sections render at once in worker processes: the page is byte for byte the serial one, and a problem a
    section finds in its worker (an unreadable table) still reaches the page's list."""
    results = make_results(tmp_path)
    (results / "cpu/bench/softmax.csv").write_bytes(b'a,b\n1,"unterminated\n')
    pages = [render_report(results, tmp_path / f"report{w}.html", CONFIG, "pytest", workers=w) for w in (1, 3)]
    serial, forked = (re.sub(r"Generated [^<]*", "", r.path.read_text()) for r in pages)
    assert forked == serial
    assert "cpu/bench/softmax.csv</code>: unreadable table" in forked


def test_partial_or_older_results_render_without_errors(tmp_path, monkeypatch):
    """Results copied in from elsewhere may lack files or fields; the framework's sections still render."""
    import gpulab.report.render as render
    from gpulab.report.sections import across, environment, methodology, summary

    monkeypatch.setattr(render, "discover_sections", lambda: [summary, environment, across, methodology])
    (tmp_path / "old/env").mkdir(parents=True)
    (tmp_path / "old/env/env.json").write_text(json.dumps({"fingerprint": "0ld", "device": {"backend": "cuda"}}))
    (tmp_path / "old/bench").mkdir()
    pd.DataFrame([_bench("old", "native", 1024, 50.0)]).to_csv(tmp_path / "old/bench/gelu.csv", index=False)
    (tmp_path / "bare/bench").mkdir(parents=True)  # no environment capture at all
    pd.DataFrame([_bench("bare", "native", 1024, 5.0)]).to_csv(tmp_path / "bare/bench/gelu.csv", index=False)
    rendered = render_report(tmp_path, tmp_path / "out/report.html", CONFIG, "pytest")
    assert rendered.errors == []
    html = rendered.path.read_text()
    assert "No environment capture" in html and "bare vs" in html.replace("old vs bare", "bare vs")


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no results found"):
        render_report(tmp_path / "nothing", tmp_path / "r.html", CONFIG, "pytest")
    assert not (tmp_path / "r.html").exists()


# ------------------------------------------------------------------------------ gpulab compare


def test_compare_flags_regressions_beyond_the_spread():
    rendered, changed = comparison_report()
    html = rendered.path.read_text()
    assert [s["id"] for s in rendered.sections][:3] == ["verdict", "summary", "changes"]
    assert "Comparison of two runs" in html
    for verdict in (SLOWER, STATUS_CHANGED):
        assert f'<td class="verdict-{verdict.replace(" ", "-")}">{verdict}</td>' in html  # a table cell, not prose
    assert changed["slower"] in html and changed["incorrect"] in html
    assert "packages.torch" in html  # the environment difference that explains it


@pytest.mark.slow
def test_compare_command_writes_the_comparison(tmp_path):
    baseline, new, _ = make_run_pair(tmp_path)
    out = tmp_path / "compare.html"
    assert gpulab_main(["compare", str(baseline), str(new), "-o", str(out)]) == 0
    assert "Changes against the baseline run" in out.read_text()


def test_compare_refuses_bad_arguments(tmp_path, capsys):
    results = make_results(tmp_path)
    with pytest.raises(SystemExit, match="not a directory"):
        gpulab_main(["compare", str(tmp_path / "missing"), str(results), "-o", str(tmp_path / "c.html")])
    with pytest.raises(SystemExit, match="same directory"):
        gpulab_main(["compare", str(results), str(results), "-o", str(tmp_path / "c.html")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="holds no results"):
        gpulab_main(["compare", str(empty), str(results), "-o", str(tmp_path / "c.html")])
    assert not (tmp_path / "c.html").exists()


@pytest.mark.slow
def test_report_command_renders_from_a_results_directory(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "cpu").symlink_to(FIXTURE_RESULTS / "cpu", target_is_directory=True)
    out = tmp_path / "again.html"
    assert gpulab_main(["report", str(results), "-o", str(out)]) == 0
    assert "Methodology &amp; reproduction" in out.read_text()


def test_a_bundle_keeps_every_link_of_the_page_once_copied_away(tmp_path, capsys):
    """``--bundle``: one zip of the page and the results files it links to; unpacked elsewhere, every relative link
    of the page opens a file of the archive, and nothing outside the results folder is taken in."""
    import zipfile

    results = tmp_path / "run" / "results"
    shutil.copytree(FIXTURE_RESULTS / "cpu", results / "cpu")
    (tmp_path / "secret.txt").write_text("not results")
    (results / "cpu" / "logs" / "elsewhere.log").symlink_to(tmp_path / "secret.txt")
    page = tmp_path / "run" / "reports" / "report.html"
    assert gpulab_main(["report", str(results), "-o", str(page), "--bundle"]) == 0
    assert "bundle written to" in capsys.readouterr().out
    away = tmp_path / "elsewhere"
    with zipfile.ZipFile(page.with_suffix(".zip")) as archive:
        names = archive.namelist()
        archive.extractall(away)
    assert "report.html" in names and not any("secret" in n or "elsewhere.log" in n for n in names)
    html = (away / "report.html").read_text()
    links = [unquote(h) for h in re.findall(r'href="(?![#/])(?![a-z]+:)([^"]+)"', html)]  # relative ones
    assert [h for h in links if h.endswith(".log")] and [h for h in links if h.endswith(".csv")]
    missing = [h for h in links if not (away / h).exists()]
    assert missing == [], missing
    assert all(h.startswith("results/cpu/") for h in links)
    # The original page keeps its links to the results folder beside it.
    assert '"../results/cpu/' in page.read_text()


def test_fixture_tables_still_match_the_steps_schemas():
    """The recorded fixture run must be refreshed (see its README) when a step changes its columns."""
    from report_fixtures import SCHEMAS

    checked = 0
    for relpath, schema in SCHEMAS.items():
        for path in FIXTURE_RESULTS.glob(f"*/{relpath}"):
            schema.read(path)
            checked += 1
    assert checked >= len(SCHEMAS)


def test_fixture_readme_marks_synthetic_numbers(fixtures):
    readme = (fixtures / "report/README.md").read_text()
    assert "synthetic" in readme.lower() and SYNTHETIC_TARGET in readme
    env = json.loads((FIXTURE_RESULTS / "cpu/env/env.json").read_text())
    assert env["device"]["backend"] == "cpu" and not env["device"]["gpu_available"]


# What a reviewer meets first: the verdict and the flags, computed from the rows -----------------------------


def _section_text(html: str, section: str) -> str:
    start = html.index(f'<section id="{section}"')
    return re.sub(r"\s+", " ", html[start:html.index("</section>", start)])


def _words(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


@functools.cache
def _flagged_report() -> tuple[str, Path]:
    """The recorded CPU run with its MLP bf16 row at 199% of its ceiling and its fast LLM decode row at 120%."""
    root = Path(tempfile.mkdtemp(prefix="gpulab-flagged-"))  # removed with the test run's other renders below
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    shutil.copytree(FIXTURE_RESULTS / "cpu", root / "results/cpu")
    mlp = root / "results/cpu/mlp/summary.csv"
    frame = pd.read_csv(mlp)
    bf16 = frame["variant"] == "bf16"
    frame.loc[bf16, "ceiling_tflops"] = frame.loc[bf16, "tflops"] / 1.99
    frame.loc[bf16, "pct_of_ceiling"] = 199.0
    frame.to_csv(mlp, index=False)
    llm = root / "results/cpu/llm/tiny__fast.csv"
    frame = pd.read_csv(llm)
    frame.loc[frame["test"].astype(str).str.startswith("tg"), "pct_of_ceiling"] = 120.0
    frame.to_csv(llm, index=False)
    rendered = render_report(root / "results", root / "report.html", CONFIG, "pytest (flagged rows)")
    assert rendered.errors == []
    return rendered.path.read_text(), root / "results"


def test_mlp_and_llm_rows_above_their_ceiling_are_flagged_and_counted_like_benchmark_rows():
    html, results = _flagged_report()
    summary = _section_text(html, "summary")
    assert "Above a ceiling: 2 rows" in _words(summary)
    assert "1 in <code>llm/tiny__fast.csv</code>" in summary and "1 in <code>mlp/summary.csv</code>" in summary
    mlp, llm = _section_text(html, "mlp"), _section_text(html, "llm")
    assert "1 MLP row above its measured ceiling" in mlp and 'class="above-ceiling"' in mlp
    assert "1 LLM row above its measured ceiling" in llm and 'class="above-ceiling"' in llm
    methodology = _section_text(html, "methodology")
    assert "In this run 2 rows exceed their ceiling" in _words(methodology) and "no row exceeds" not in methodology
    # The same rows, counted by the one function every section uses.
    assert len(findings.above_ceiling(ResultsIndex(results), "cpu")) == 2


def test_a_run_within_its_ceilings_says_so_and_flags_nothing():
    html = cpu_report()
    assert "Above a ceiling: none" in _words(_section_text(html, "summary"))
    assert 'class="above-ceiling"' not in html
    assert "In this run no row exceeds its ceiling." in _section_text(html, "methodology")


def test_the_verdict_names_the_fastest_implementation_from_the_rows(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE_RESULTS / "cpu", results / "cpu")
    gelu = pd.read_csv(results / "cpu/bench/gelu.csv")
    ok = gelu[gelu["status"] == "ok"]
    expected = ok.loc[ok.groupby(["size", "dtype"])["median_ms"].idxmin(), "impl"].value_counts()
    verdict = findings.verdict(ResultsIndex(results), "cpu", ("gelu",))["bench"][0]
    assert {w["impl"]: w["cells"] for w in verdict["wins"]} == expected.to_dict()
    # Make cpp_ext the fastest everywhere: the verdict follows the data, not a typed sentence.
    fast = gelu["impl"] == "cpp_ext"
    gelu.loc[fast, "median_ms"] = gelu.loc[fast, "median_ms"] / 1000
    gelu.to_csv(results / "cpu/bench/gelu.csv", index=False)
    verdict = findings.verdict(ResultsIndex(results), "cpu", ("gelu",))["bench"][0]
    assert verdict["wins"] == [{"impl": "cpp_ext", "cells": 9}]
    assert verdict["laggard"]["impl"] != "cpp_ext"
    html = render_report(results, tmp_path / "r.html", CONFIG, "pytest").path.read_text()
    summary = _section_text(html, "summary")
    assert "cpp_ext fastest in all 9 cells" in _words(summary)


def test_unstable_rows_are_headlined_per_table_with_the_reason_and_no_gpu_words_on_a_cpu():
    unstable = {u["table"]: u for u in findings.instability(ResultsIndex(FIXTURE_RESULTS), "cpu")}
    assert unstable["llm/*.csv"]["why"].startswith("only because they have")
    assert "median cv" in unstable["bench/gelu.csv"]["why"]
    gelu = pd.read_csv(FIXTURE_RESULTS / "cpu/bench/gelu.csv")
    assert unstable["bench/gelu.csv"]["unstable"] == int((gelu["stable"].astype(str) == "False").sum())
    html = cpu_report()
    summary = _section_text(html, "summary")
    assert "gelu benchmark: " + str(unstable["bench/gelu.csv"]["unstable"]) + " of 36 rows" in _words(summary)
    assert "throttl" not in summary and "throttl" not in _section_text(html, "bench")


def test_methodology_lists_the_ceiling_methods_the_run_measured():
    html = cpu_report()
    text = _words(_section_text(html, "methodology"))
    ceilings = pd.read_csv(FIXTURE_RESULTS / "cpu/bench/ceilings.csv")
    ran = ceilings[(ceilings["kind"] == "add") & (ceilings["status"] == "ok")]["method"].unique()
    assert list(ran) == ["torch.add"]
    assert "add (two reads and one write): the best of torch.add; not measured here:" in text
    assert "vector_add" not in text and "2-core" not in text and "RAISE_LIMIT" not in text


def test_the_studys_run_beside_another_model_says_they_differ():
    llm = _section_text(cpu_report(), "llm")
    assert "Not the same model or machine" in llm and "<code>tiny</code> (tiny weights) on AMD EPYC" in llm
    assert "You are a gifted poet." in llm and 'lang="zh-Hans"' in llm


def test_no_figure_text_is_smaller_than_the_floor():
    from gpulab.report.render import ReportContext
    from gpulab.report.sections import bench, llm, mlp

    plots.apply_style()
    ctx = ReportContext(ResultsIndex(FIXTURE_RESULTS), FIXTURE_RESULTS.parent / "r.html", CONFIG, "pytest")
    found = []
    for module in (bench, mlp, llm):
        data = module.build(ctx)
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, plots.Figure):
                found.append(item)
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    assert len(found) >= 8
    assert min(f.smallest_text_pt for f in found) >= plots.SMALL_PT


def test_rows_their_step_did_not_judge_are_not_called_unstable(tmp_path):
    shutil.copytree(Path(__file__).parent / "fixtures" / "build" / "results", tmp_path / "results")
    path = tmp_path / "results" / "h100" / "build" / "hip_standalone.csv"
    table = pd.read_csv(path)
    timed = table["reps"].notna()
    table["stable"] = ""  # as the standalone program's rows were written before they were judged
    table.to_csv(path, index=False)
    assert "build/hip_standalone.csv" not in {u["table"] for u in findings.instability(
        ResultsIndex(tmp_path / "results"), "h100")}
    table["stable"] = table["stable"].where(~timed, "False")
    table.to_csv(path, index=False)
    judged = {u["table"]: u for u in findings.instability(ResultsIndex(tmp_path / "results"), "h100")}
    assert judged["build/hip_standalone.csv"]["unstable"] == judged["build/hip_standalone.csv"]["rows"] == timed.sum()
