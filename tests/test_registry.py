"""The registries are the one place an op or an engine is named: a toy op registered here, with its kernel file and
nothing else, is picked up by the benchmark matrix, the config, the ahead-of-time compile table and the report."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from gpulab.bench.registry import REGISTRY, BenchContext
from gpulab.bench.runner import BENCH, run_cell
from gpulab.core import ops
from gpulab.core.device import detect
from gpulab.core.timing import TimingSettings

FAST = TimingSettings(min_time_s=0.005, min_reps=3, max_reps=20, warmup_reps=1, flush_cache=False, min_span_s=0,
                      reference=False)

# The toy op's kernel file, in the style of the Triton tutorials: <op>_kernel with *_ptr arguments, the thin
# wrapper <op>(x, out) through the shared elementwise launcher.
SCALE_KERNEL = '''
    import triton
    import triton.language as tl

    from gpulab.kernels.triton.config import (
        ELEMENTWISE_PRUNE, elementwise_configs, elementwise_out, launch_elementwise, quick_bench)


    @triton.autotune(configs=elementwise_configs(), key=["n_elements"], prune_configs_by=ELEMENTWISE_PRUNE,
                     do_bench=quick_bench)
    @triton.jit
    def scale_kernel(x_ptr, y_ptr, n_elements, OFFSETS_64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(axis=0)
        if OFFSETS_64:
            pid = pid.to(tl.int64)
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        tl.store(y_ptr + offsets, (x * 1.5).to(y_ptr.dtype.element_ty), mask=mask)


    def scale(x, out=None, *, block_size=None, num_warps=None):
        y = elementwise_out("scale", x, out)
        launch_elementwise(scale_kernel, (x, y), y.numel(), block_size, num_warps)
        return y
'''

# The toy op's registry entry.
SCALE_ENTRY = '''
    import operator

    from gpulab.core.ops import OpSpec, register_op


    def scale_rows(x):
        return x * 1.5


    def manual_scale(x):
        out = x.clone()
        out.mul_(1.5)
        return out


    def native_scale():
        return lambda x: x * 1.5


    SCALE = register_op(OpSpec(
        "scale", "Scale by 1.5 (a toy op)", "1.5 x", "copy", n_inputs=1, ndim=1, bytes_per_element=2,
        flops_per_element=1, input_scale=1.0, exact=scale_rows, manual=manual_scale, native=native_scale,
        triton="toy_ops.scale"))
'''


@pytest.fixture
def toy_op(tmp_path, monkeypatch):
    """The toy op's package (its kernel file and its entry) on sys.path, registered for this test only."""
    package = tmp_path / "toy_ops"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text(textwrap.dedent(SCALE_KERNEL))
    (package / "entry.py").write_text(textwrap.dedent(SCALE_ENTRY))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(ops.OPS)
    entry = importlib.import_module("toy_ops.entry")  # the entry registers the op, as a module of gpulab would
    yield entry.SCALE, tmp_path
    ops.OPS.clear()
    ops.OPS.update(before)
    for name in [m for m in sys.modules if m.startswith("toy_ops")]:
        del sys.modules[name]


def test_a_registered_op_is_in_the_matrix_and_the_config(toy_op):
    from gpulab.workflow.config import validate_config

    assert REGISTRY.impls("scale") == ["manual", "native", "cpp_ext", "triton", "torch_compile"]
    config = validate_config({"bench": {"ops": ["scale"], "sizes": {"scale": [4096]}}})
    assert config["bench"]["ops"] == ["scale"] and "scale" in validate_config({})["bench"]["ops"]
    ctx = BenchContext(detect(), "local")
    rows = [r for impl in ("manual", "native") for r in run_cell(
        "scale", impl, shapes=[(4096,), (98_432,)], dtypes=["fp32", "bf16"], settings=FAST, ctx=ctx, fingerprint="fp",
        progress=False)]
    assert {r["status"] for r in rows} == {"ok"}, [r["reason"] for r in rows]
    assert {r["bytes_moved"] for r in rows if r["dtype"] == "fp32"} == {2 * 4 * 4096, 2 * 4 * 98_432}
    # the extension has no such op: a recorded skip, not a crash
    (ext,) = run_cell("scale", "cpp_ext", shapes=[(8,)], dtypes=["fp32"], settings=FAST, ctx=ctx, fingerprint="fp",
                      progress=False)
    assert ext["status"] == "skipped" and ext["reason"] == "the C++ extension has no scale op"


def test_a_registered_ops_triton_kernel_runs_as_a_matrix_cell_in_the_interpreter(toy_op):
    pytest.importorskip("triton")
    _, root = toy_op
    code = textwrap.dedent('''
        import toy_ops.entry
        from gpulab.bench.registry import BenchContext
        from gpulab.bench.runner import run_cell
        from gpulab.core.device import detect
        from gpulab.core.timing import TimingSettings

        settings = TimingSettings(min_time_s=0.001, min_reps=3, max_reps=5, warmup_reps=1, flush_cache=False,
                                  min_span_s=0, reference=False)
        rows = run_cell("scale", "triton", shapes=[(5000,)], dtypes=["fp32", "bf16"], settings=settings,
                        ctx=BenchContext(detect(), "local"), fingerprint="fp", progress=False)
        assert [r["status"] for r in rows] == ["ok", "ok"], [r["reason"] for r in rows]
    ''')
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_registered_ops_kernel_is_in_the_ahead_of_time_compile_table(toy_op, tmp_path):
    pytest.importorskip("triton")
    from gpulab.toolchains.archs import arch
    from gpulab.toolchains.job import triton_tasks, with_arch_figures

    a = arch("gfx90a")
    with ExitStack() as stack:
        tasks = triton_tasks(a, ("fp32",), "auto", tmp_path / "cache", stack)
        mine = [t for t in tasks if t.args[0].op == "scale"]
        # the family's elementwise launches, the kernel's *_ptr arguments as its tensors
        assert len(mine) == len({t.args[0].variant for t in mine}) >= 7
        assert list(mine[0].args[0].signature)[:3] == ["x_ptr", "y_ptr", "n_elements"]
        (row,) = mine[0]()
    row = with_arch_figures(row, a)
    assert row["status"] == "ok", row.get("reason")
    assert row["op"] == "scale" and row["kernel"] == "scale_kernel" and row["registers"] > 0


def test_a_registered_op_has_its_section_in_the_report(toy_op, tmp_path):
    from gpulab.report.render import render_report
    from gpulab.workflow.config import validate_config

    fixture = Path(__file__).resolve().parent / "fixtures" / "report" / "results" / "cpu"
    results = tmp_path / "results"
    (results / "cpu" / "env").mkdir(parents=True)
    (results / "cpu" / "env" / "env.json").write_text((fixture / "env" / "env.json").read_text())
    ctx = BenchContext(detect(), "cpu")
    rows = [r for impl in ("native", "manual") for r in run_cell(
        "scale", impl, shapes=[(4096,), (65_536,)], dtypes=["fp32"], settings=FAST, ctx=ctx, fingerprint="fp",
        progress=False)]
    BENCH.write(rows, results / "cpu" / "bench" / "scale.csv")
    report = render_report(results, tmp_path / "report.html", validate_config({}), "pytest", strict=True)
    html = report.path.read_text(encoding="utf-8")
    assert "Scale by 1.5 (a toy op)" in html and "1.5 x" in html


def _scale_by(factor: float):
    def kernel(x):
        return (x.float() * factor).to(x.dtype)
    return kernel


@pytest.fixture
def toy_ext_op():
    """A toy op registered with an extension op: ``torch.ops.gpulab.toy_scale`` defined in the extension's
    namespace (as the C++ library defines its ops), its kernel swappable through ``kernel[0]``."""
    import torch

    kernel = [_scale_by(1.5)]
    lib = torch.library.Library("gpulab", "FRAGMENT")
    lib.define("toy_scale(Tensor x) -> Tensor")
    lib.impl("toy_scale", lambda x: kernel[0](x), "CompositeExplicitAutograd")
    before = dict(ops.OPS)
    spec = ops.register_op(ops.OpSpec(
        "toy_scale", "Scale by 1.5 (a toy extension op)", "1.5 x", "copy", n_inputs=1, ndim=1, bytes_per_element=2,
        flops_per_element=1, input_scale=1.0, exact=lambda x: x * 1.5, manual=lambda x: x * 1.5,
        native=lambda: lambda x: x * 1.5, ext_op="toy_scale", triton=None))
    yield spec, kernel
    ops.OPS.clear()
    ops.OPS.update(before)
    lib._destroy()


def test_an_op_registered_with_an_extension_op_is_checked_by_the_extension_step(toy_ext_op):
    from gpulab.native.checks import EXTENSION_CHECKS, check_ops, checked_ops

    spec, kernel = toy_ext_op
    assert spec in checked_ops() and {s.ext_op for s in checked_ops()} >= {"vector_add", "gelu_tanh", "softmax_rows"}
    cpu = detect()
    table = EXTENSION_CHECKS.frame(check_ops("local", "fp", device=cpu, dtypes=("fp32", "bf16"), ops=[spec]))
    assert set(table["op"]) == {"toy_scale"} and set(table["layout"]) == {"aligned", "offset"}
    assert (table["status"] == "ok").all(), table.loc[table["status"] != "ok", ["dtype", "shape", "reason"]]
    assert set(table["shape"]) >= {"1", "1025", str((1 << 20) + 5)}
    kernel[0] = _scale_by(1.501)  # a kernel a thousandth off is caught at every size
    wrong = EXTENSION_CHECKS.frame(check_ops("local", "fp", device=cpu, dtypes=("fp32",), ops=[spec]))
    assert (wrong["status"] == "incorrect").all()


def _schemas() -> dict[str, object]:
    """Every table schema the steps write, by its module-level name."""
    from gpulab import toolchains
    from gpulab.bench import runner, tune
    from gpulab.core import ceilings
    from gpulab.core.tables import TableSchema
    from gpulab.env import capture, runtime_stack
    from gpulab.llm import bench as llm_bench
    from gpulab.llm import profile as llm_profile
    from gpulab.llm import tune as llm_tune
    from gpulab.mlp import ceilings as mlp_ceilings
    from gpulab.mlp import profile as mlp_profile
    from gpulab.native import checks, hip_standalone, step, timing_pitfalls

    modules = (runner, tune, ceilings, capture, runtime_stack, llm_bench, llm_profile, llm_tune, mlp_ceilings,
               mlp_profile, checks, hip_standalone, step, timing_pitfalls, toolchains)
    found = {id(value): (f"{m.__name__}.{name}", value) for m in modules for name, value in vars(m).items()
             if isinstance(value, TableSchema)}
    return dict(found.values())


def test_every_table_schema_knows_the_path_the_workflow_writes_it_at():
    import json
    import re

    root = Path(__file__).resolve().parents[1]
    recorded = json.loads((root / "tests" / "fixtures" / "report" / "rule_outputs.json").read_text())
    outputs = {re.sub(r"\{(\w+),[^}]*\}", r"{\1}", p) for paths in recorded.values() for p in paths}
    rules = "\n".join(p.read_text() for p in (root / "workflow" / "rules").glob("*.smk"))
    outputs |= {f"results/{{target}}/{p}" for p in re.findall(r'result\("([^"]+)"\)', rules)}
    schemas = _schemas()
    assert len(schemas) >= 17
    unplaced = {name: s.path for name, s in schemas.items() if f"results/{{target}}/{s.path}" not in outputs}
    assert not unplaced, unplaced
    from gpulab.core.ceilings import CEILINGS
    from gpulab.llm.bench import LLM

    assert CEILINGS.at() == "bench/ceilings.csv" and LLM.at(model="tiny", engine="hf") == "llm/tiny__hf.csv"
