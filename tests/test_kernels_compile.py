"""Ahead-of-time kernel compiles for GPUs that are not here: real compiles, parsed resources, the per-family
launch choices checked against the compiled table, failures recorded, and the report section."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

triton = pytest.importorskip("triton")

from gpulab.kernels.triton import config as triton_config  # noqa: E402
from gpulab.kernels.triton.aot import DTYPES, Launch  # noqa: E402
from gpulab.kernels.triton.config import Target  # noqa: E402
from gpulab.kernels.triton.launches import launches  # noqa: E402
from gpulab.toolchains import KERNEL_RESOURCES  # noqa: E402
from gpulab.toolchains.archs import ARCHS, arch, occupancy, warps_per_simd_by_registers  # noqa: E402
from gpulab.toolchains.job import vector_elements  # noqa: E402
from gpulab.toolchains.resources import amdgcn_kernels, elf_section_size, ptxas_resources  # noqa: E402
from gpulab.toolchains.triton_aot import compile_cached, compile_launch, gpu_target, private_triton_cache  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
ALL_DTYPES = tuple(DTYPES)
SIZES = vector_elements("auto")  # the element counts the benchmark launches gelu/add at on a GPU


def _launch(target: Target, kernel: str, dtype: str = "fp32") -> Launch:
    return next(x for x in launches(target, (dtype,), SIZES) if x.kernel.__name__ == kernel)


@pytest.mark.parametrize("name", ["gfx1151", "sm_90"])
def test_a_real_compile_reports_sane_resources(name):
    a = arch(name)
    launch = _launch(a.target, "softmax_looped_kernel")
    with private_triton_cache():
        row = compile_launch(launch, a)
    assert row["status"] == "ok", row.get("reason")
    assert 8 <= row["registers"] <= 255  # a looped online softmax needs dozens of registers, never more than 255
    assert row["spilled_regs"] == 0 and row["scratch_bytes"] == 0
    assert 1000 < row["code_bytes"] < 100_000
    assert 0 < row["compile_s"] < 60
    assert (row["sgprs"] is None) == (a.backend == "cuda")
    warps, limiter = occupancy(a, row["registers"], launch.num_warps, row["lds_bytes"], row["sgprs"] or 0)
    assert 0 < warps <= a.max_warps_per_unit and limiter


@pytest.mark.parametrize("name", ["gfx1151", "gfx1100", "gfx942", "gfx90a"])
def test_register_occupancy_matches_llvms_own_note(name):
    """Our per-SIMD register arithmetic (limits table) against the "; Occupancy:" comment LLVM writes."""
    from triton.compiler import ASTSource

    a = arch(name)
    with private_triton_cache():
        for launch in launches(a.target, ("bf16",), SIZES)[::9]:
            src = ASTSource(launch.kernel, launch.signature, launch.constexprs, launch.attrs("hip"))
            compiled = triton.compile(src, target=gpu_target(a), options={"num_warps": launch.num_warps})
            figures = amdgcn_kernels(compiled.asm["amdgcn"])[compiled.metadata.name]
            ours = warps_per_simd_by_registers(a, figures["registers"], figures["sgprs"])
            assert ours == figures["compiler_waves_per_simd"], (launch.variant, figures)


def test_families_pick_their_launches():
    rdna, cdna, nvidia = Target("hip", 32, "gfx1151"), Target("hip", 64, "gfx942"), Target("cuda", 32, "sm_90")
    assert (rdna.family, cdna.family, nvidia.family) == ("rdna", "cdna", "nvidia")
    assert Target("interpreter", 32).family == "nvidia"
    for target in (rdna, cdna, nvidia):
        # Same threads per block on every family: num_warps x warp size equals NVIDIA's.
        threads = [(b, w * target.warp_size) for b, w in triton_config.elementwise_shapes(target)]
        assert threads == [(b, w * 32) for b, w in triton_config.elementwise_shapes(nvidia)]
        softmax = [x for x in launches(target, ("fp32",), SIZES) if x.op == "softmax"]
        assert max(x.num_warps * target.warp_size for x in softmax) == 1024


def test_64bit_offset_variants_are_compiled_when_the_benchmark_launches_them():
    target = Target("hip", 32, "gfx1151")

    def variants(sizes):
        return {x.variant.split()[-1] for x in launches(target, ("bf16",), vector_elements(sizes)) if x.op == "add"}

    assert variants("auto") == {"OFFSETS_64=0"}  # the auto sizes stop at 2^30 elements
    assert variants({"add": [3 * 2**30]}) == {"OFFSETS_64=0", "OFFSETS_64=1"}


def test_the_autotuner_prunes_to_the_running_family(monkeypatch):
    configs = triton_config.elementwise_configs()
    for target in (Target("hip", 64, "gfx90a"), Target("cuda", 32, "sm_90")):
        monkeypatch.setattr(triton_config, "current_target", lambda t=target: t)
        kept = triton_config.prune_to_family(configs, {})
        shapes = sorted((c.kwargs["BLOCK_SIZE"], c.num_warps) for c in kept)
        assert shapes == sorted(triton_config.elementwise_shapes(target))


@pytest.fixture(scope="module")
def compiled_table(tmp_path_factory) -> pd.DataFrame:
    """Every architecture's table, through the rule's own function (outcomes cached in .cache/)."""
    from gpulab.toolchains.job import compile_arch

    frames = [compile_arch(name, ("fp32", "fp16", "bf16"), target="test", fingerprint="test") for name in ARCHS]
    return pd.concat(frames, ignore_index=True)


@pytest.mark.slow
def test_no_chosen_configuration_spills_or_falls_below_half_occupancy(compiled_table):
    triton_rows = compiled_table[compiled_table["compiler"].str.startswith("triton")]
    assert (triton_rows["status"] == "ok").all(), triton_rows[triton_rows["status"] != "ok"][["arch", "reason"]]
    for name, a in ARCHS.items():
        rows = triton_rows[triton_rows["arch"] == name]
        # The table covers exactly what the launchers would launch on this arch's family.
        expected = {(x.kernel.__name__, x.variant, x.dtype) for x in launches(a.target, ALL_DTYPES, SIZES)}
        assert set(zip(rows["kernel"], rows["variant"], rows["dtype"], strict=True)) == expected, name
    # The LLM decode GEMV's tile is triton.autotune's pick at run time, not a launcher's choice: its rows are one
    # representative config (the fused gate/up form holds two accumulators: 37.5% occupancy on sm_90), so only
    # spills count against them.
    chosen = triton_rows["op"] != "llm_decode"
    bad = triton_rows[(triton_rows["spilled_regs"] > 0) | (triton_rows["scratch_bytes"] > 0)
                      | (chosen & (triton_rows["occupancy"] < 0.5))]
    assert bad.empty, bad[["arch", "kernel", "variant", "dtype", "registers", "spilled_regs", "occupancy"]]
    assert (triton_rows["op"] == "llm_decode").sum() == 6 * len(ARCHS)  # 3 GEMV forms, prompt RoPE, attention x2


@pytest.mark.slow
def test_hipcc_rows_compile_gfx90a_and_record_the_archs_it_refuses(compiled_table):
    if shutil.which("hipcc") is None:
        pytest.skip("hipcc is not installed")
    hip = compiled_table[compiled_table["compiler"].str.startswith("hipcc")].set_index("arch")
    ok = hip.loc[["gfx90a"]]
    assert (ok["status"] == "ok").all() and (ok["kernel"] == "vector_add_kernel").any()
    assert (ok["registers"] > 0).all() and (ok["occupancy"] > 0).all() and (ok["code_bytes"] > 0).all()
    refused = hip[hip["status"] != "ok"]
    for arch_name, row in refused.iterrows():
        assert row["status"] == "skipped" and arch_name in row["reason"], row["reason"]


def test_a_kernel_that_does_not_compile_is_a_failed_row_with_the_compilers_message(tmp_path):
    source = tmp_path / "broken_kernel.py"
    source.write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def broken_kernel(x_ptr, BLOCK: tl.constexpr):
            offsets = tl.arange(0, 3)  # not a power of two: Triton refuses
            tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + BLOCK)
    """))
    spec = importlib.util.spec_from_file_location("broken_kernel", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["broken_kernel"] = module
    spec.loader.exec_module(module)
    launch = Launch(op="add", kernel=module.broken_kernel, variant="BLOCK=4", dtype="fp32",
                    signature={"x_ptr": "*fp32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 4}, num_warps=1)
    for name in ("gfx1151", "sm_80"):
        with private_triton_cache():
            row = compile_launch(launch, arch(name))
        assert row["status"] == "failed"
        assert "power of 2" in row["reason"] and "CompilationError" in row["reason"], row["reason"]
    frame = KERNEL_RESOURCES.frame([{"target": "t", "fingerprint": "f", "arch": "sm_80", **row}])
    assert frame["registers"].isna().all()
    with private_triton_cache():
        again = compile_cached(launch, arch("sm_80"), tmp_path / "cache")
    assert again["status"] == "failed" and not again["cached"]
    assert not list((tmp_path / "cache").rglob("*.json"))  # failures are not cached: the next run compiles again


def test_parsers_read_the_compilers_resource_notes():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Function properties for k\n"
           "    48 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 0 barriers\n")
    assert ptxas_resources(log) == {"registers": 255, "spilled_regs": 10, "scratch_bytes": 48}
    with pytest.raises(ValueError, match="ptxas log"):
        ptxas_resources("ptxas fatal: nothing")
    with pytest.raises(ValueError, match="amdgpu_metadata"):
        amdgcn_kernels("; no metadata here")
    with pytest.raises(ValueError, match="ELF64"):
        elf_section_size(b"not an elf", ".text")


def test_occupancy_follows_the_limits():
    sm90, gfx90a, gfx1151 = arch("sm_90"), arch("gfx90a"), arch("gfx1151")
    assert occupancy(sm90, 32, 4, 0) == (64, "warps")  # 32 regs x 64 warps = the whole 64 K register file
    assert occupancy(sm90, 128, 8, 0) == (16, "registers")  # 4096 regs per warp -> 16 warps
    assert occupancy(sm90, 16, 1, 0) == (32, "blocks")  # 32 resident blocks of one warp
    assert occupancy(sm90, 16, 4, 100 * 1024) == (8, "shared memory")  # two 101 KB blocks in 228 KB
    assert occupancy(gfx90a, 128, 4, 0) == (16, "registers")  # 512 / 128 = 4 waves per SIMD x 4 SIMDs
    assert occupancy(gfx1151, 120, 4, 0) == (48, "registers")  # 1536 // 120 = 12 waves per SIMD x 4 SIMDs
    assert occupancy(gfx1151, 121, 4, 0) == (40, "registers")  # allocated in 24s: 144 -> 10 waves per SIMD
    with pytest.raises(ValueError, match="unknown architecture 'gfx1200'"):
        arch("gfx1200")


def test_report_section_shows_heatmaps_and_measured_beside_static(tmp_path):
    from gpulab.report.render import ReportContext
    from gpulab.report.results import ResultsIndex
    from gpulab.report.sections import kernels

    shutil.copytree(FIXTURES / "h100", tmp_path / "h100")  # the recorded H100 run: its bench tables and env.json
    a = arch("sm_90")
    rows = []
    with private_triton_cache():
        for launch in [x for x in launches(a.target, ("fp32",), SIZES) if x.op == "gelu"][:2]:
            row = compile_launch(launch, a)
            warps, limiter = occupancy(a, row["registers"], launch.num_warps, row["lds_bytes"])
            rows.append({"target": "h100", "fingerprint": "dev", "arch": "sm_90", "compiler": "triton 3",
                         "op": "gelu", "kernel": "gelu_kernel", "variant": launch.variant, "dtype": "fp32",
                         "num_warps": launch.num_warps, "warps_per_unit": warps, "occupancy": warps / 64,
                         "occupancy_limiter": limiter, **row})
    rows.append({"target": "h100", "fingerprint": "dev", "arch": "gfx1151", "compiler": "hipcc (clang 15)",
                 "status": "skipped", "reason": "hipcc --offload-arch=gfx1151: invalid target ID"})
    KERNEL_RESOURCES.write(rows, tmp_path / "h100" / "build" / "kernel_resources.csv")
    section = kernels.build(ReportContext(ResultsIndex(tmp_path), tmp_path / "report.html", {}, "test"))
    assert [f.alt.split(" of ")[0] for f in section["figures"]] == ["Heatmap", "Heatmap"]
    measured = section["measured"]
    assert set(measured["op"]) == {"gelu"} and (measured["best_gbps"] > 1000).all()  # the H100 fixture's GB/s
    assert (measured["launches"] == 2).all() and measured["occupancy_min"].between(0.5, 1).all()
    assert list(section["not_ok"]["status"]) == ["skipped"]


def _args_for(launch: Launch, device: str) -> tuple[list, int]:
    """Arguments of a real launch matching the launch's signature (aligned tensors, sizes multiples of 16), and
    its grid: one program, or one row's SPLIT programs for the split softmax (they wait for each other)."""
    import torch

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32}
    split = launch.constexprs.get("SPLIT", 1)
    ints = [name for name, kind in launch.signature.items() if kind in ("i32", "i64")]
    looped = launch.kernel.__name__ == "softmax_looped_kernel"
    cols = launch.constexprs.get("BLOCK_N", 0) * (2 if looped else split)
    values = {"n_elements": 2**20, "n_rows": 64, "n_cols": cols, "x_row_stride": cols, "y_row_stride": cols}
    numel = values["n_elements"] if "n_elements" in ints else 64 * cols
    pointers = [torch.randn(numel, device=device).to(dtypes[launch.dtype]) if name in ("x_ptr", "y_ptr", "output_ptr")
                else torch.zeros(64 * split, dtype=dtypes[kind[1:]], device=device)  # the split kernel's workspace
                for name, kind in launch.signature.items() if kind[0] == "*"]
    return pointers + [values[name] for name in ints], split


@pytest.mark.skipif(not importlib.util.find_spec("torch") or not __import__("torch").cuda.is_available(),
                    reason="needs a GPU: compares the table with kernels the driver loaded")
def test_launched_kernels_use_the_registers_the_table_records():
    """On a GPU host: each gelu and softmax launch run for real reports (n_regs, n_spills) equal to the
    ahead-of-time compile of the same launch for this device's architecture."""
    from gpulab.kernels.triton.config import current_target

    target = current_target()
    if target.arch not in ARCHS:
        pytest.skip(f"{target.arch} is not one of the compiled architectures")
    a = arch(target.arch)
    todo = [x for x in launches(target, ("fp32", "bf16"), SIZES) if x.op in ("gelu", "softmax")]
    for launch in todo:
        with private_triton_cache():
            row = compile_launch(launch, a)
        args, programs = _args_for(launch, "cuda")
        compiled = launch.kernel[(programs,)](*args, **launch.constexprs, num_warps=launch.num_warps)
        assert row["status"] == "ok", row.get("reason")
        assert (compiled.n_regs, compiled.n_spills > 0) == (row["registers"], row["spilled_regs"] > 0), launch.variant


def test_aggregate_concatenates_arch_tables_and_keeps_integer_columns(tmp_path):
    from gpulab.toolchains import aggregate

    ok = {"target": "t", "fingerprint": "f", "status": "ok", "arch": "sm_90", "kernel": "k", "registers": 40}
    skipped = {"target": "t", "fingerprint": "f", "status": "skipped", "arch": "gfx1151", "reason": "no hipcc"}
    KERNEL_RESOURCES.write([ok], tmp_path / "sm_90.csv")
    KERNEL_RESOURCES.write([skipped], tmp_path / "gfx1151.csv")
    table = aggregate([tmp_path / "sm_90.csv", tmp_path / "gfx1151.csv"])
    assert list(table["arch"]) == ["sm_90", "gfx1151"] and list(table.columns) == KERNEL_RESOURCES.names
    assert str(table["registers"].dtype) == "Int64" and table.to_csv(index=False).count(",40,") == 1
