"""Build steps: the standalone HIP program, the PyTorch extension, the timing-pitfalls experiment.

Compilers are real: hipcc (Debian's, for gfx90a) and nvcc compile the standalone source, the host
compiler builds the CPU extension. A test that needs a compiler which is absent is skipped with the
reason; CI installs hipcc and has nvcc and g++.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpulab.core import ops
from gpulab.core.device import DeviceInfo, detect
from gpulab.core.tables import SchemaError
from gpulab.core.timing import TimingSettings, is_stable
from gpulab.native import checks as ext_checks
from gpulab.native import compile as ext_compile
from gpulab.native import plan as ext_plan
from gpulab.native import step as ext_step
from gpulab.native.hip_standalone import (
    HIP_STANDALONE,
    SOURCE,
    _measured,
    compile_command,
    parse_output,
    plan_standalone,
    run_standalone,
)
from gpulab.native.manifest import load_from_manifest, read_manifest, write_manifest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "build"
HIPCC = shutil.which("hipcc")
NVCC = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))
FAST = TimingSettings(min_time_s=0.01, min_reps=3, max_reps=5, warmup_reps=1, flush_cache=False)


def device(backend: str, gpu: bool, arch: str | None = None, hip: str | None = None,
           cuda: str | None = None) -> DeviceInfo:
    return DeviceInfo(backend=backend if gpu else "cpu", torch_version="test", hip_version=hip, cuda_version=cuda,
                      gpu_available=gpu, reason="" if gpu else "no GPU in this test", arch=arch)


ROCM_GPU = device("rocm", True, "gfx90a", hip="7.1")
CUDA_GPU = device("cuda", True, "sm_90", cuda="13.0")
CPU_TORCH = device("cpu", False)
ROCM_TORCH_NO_GPU = device("rocm", False, hip="7.1")


@pytest.fixture
def fake_toolchain(tmp_path: Path) -> Path:
    """A PATH directory holding stand-ins named hipcc and nvcc: planning only looks them up."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("hipcc", "nvcc"):
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\necho 'HIP version: 0.0-test'\necho 'Cuda compilation tools, release 0.0'\n")
        exe.chmod(0o755)
    return bin_dir


# --------------------------------------------------------------------------- architecture selection


def test_standalone_uses_hipcc_for_the_detected_amd_arch(fake_toolchain: Path) -> None:
    plan, why = plan_standalone(ROCM_GPU, [], {"PATH": str(fake_toolchain)}, toolkit_dirs=False)
    assert plan is not None, why
    assert (plan.compiler, plan.arch, plan.runs_here) == ("hipcc", "gfx90a", True)
    cmd = compile_command(plan, Path("/tmp/x"), ["-O3"])
    assert "--offload-arch=gfx90a" in cmd and cmd[-1] == str(SOURCE)


@pytest.mark.parametrize(("override", "arch"), [("11.0.0", "gfx1100"), ("9.0.10", "gfx90a"), ("10.3.0", "gfx1030")])
def test_standalone_honours_hsa_override(fake_toolchain: Path, override: str, arch: str) -> None:
    env = {"PATH": str(fake_toolchain), "HSA_OVERRIDE_GFX_VERSION": override}
    plan, _ = plan_standalone(ROCM_TORCH_NO_GPU, [], env, toolkit_dirs=False)
    assert plan is not None and plan.arch == arch and not plan.runs_here
    assert plan.no_gpu_reason.startswith("no AMD GPU")


def test_standalone_pins_only_the_matching_kind(fake_toolchain: Path) -> None:
    env = {"PATH": str(fake_toolchain)}
    amd, _ = plan_standalone(ROCM_GPU, ["sm_80", "gfx942"], env, toolkit_dirs=False)
    nvidia, _ = plan_standalone(CUDA_GPU, ["gfx942", "sm_80"], env, toolkit_dirs=False)
    assert amd is not None and amd.arch == "gfx942"
    assert nvidia is not None and (nvidia.compiler, nvidia.arch) == ("nvcc", "sm_80")


def test_standalone_uses_nvcc_with_the_portability_header_on_cuda(fake_toolchain: Path) -> None:
    plan, _ = plan_standalone(CUDA_GPU, [], {"PATH": str(fake_toolchain)}, toolkit_dirs=False)
    assert plan is not None and (plan.compiler, plan.arch, plan.runs_here) == ("nvcc", "sm_90", True)
    cmd = compile_command(plan, Path("/tmp/x"), ["-O3"])
    assert cmd[1:3] == ["-x", "cu"] and "-arch=sm_90" in cmd and f"-I{SOURCE.parent}" in cmd


def test_cpu_machine_prefers_hipcc_then_nvcc(fake_toolchain: Path, tmp_path: Path) -> None:
    both, _ = plan_standalone(CPU_TORCH, [], {"PATH": str(fake_toolchain)}, toolkit_dirs=False)
    assert both is not None and (both.compiler, both.arch) == ("hipcc", "gfx90a")  # Debian hipcc's device libs
    only_nvcc = tmp_path / "only_nvcc"
    only_nvcc.mkdir()
    (only_nvcc / "nvcc").symlink_to(fake_toolchain / "nvcc")
    plan, _ = plan_standalone(CPU_TORCH, [], {"PATH": str(only_nvcc)}, toolkit_dirs=False)
    assert plan is not None and (plan.compiler, plan.arch) == ("nvcc", "nvcc-default")
    assert not any(a.startswith("-arch") for a in compile_command(plan, Path("/tmp/x"), []))
    assert plan.no_gpu_reason.startswith("no NVIDIA GPU")


def test_no_compiler_is_a_recorded_skip(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    rows = run_standalone(
        target="t", fingerprint="fp", build_config={"standalone_sizes": [7, 1024]}, timing=FAST,
        out_csv=tmp_path / "hip_standalone.csv", build_log=tmp_path / "b.log", run_log=tmp_path / "r.log",
        work_dir=tmp_path / "work", device=CPU_TORCH, environ={"PATH": str(empty)}, toolkit_dirs=False)
    table = HIP_STANDALONE.read(tmp_path / "hip_standalone.csv")
    assert len(rows) == 3 and set(table["status"]) == {"skipped"}
    assert table["reason"].str.contains("no compiler: hipcc or nvcc not found").all()
    assert list(table["phase"]) == ["build", "run", "run"]


def test_extension_arch_environment() -> None:
    assert ext_plan.arch_environment("cuda", ["sm_90"]) == {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert ext_plan.arch_environment("cuda", ["sm_90a", "sm_120"]) == {"TORCH_CUDA_ARCH_LIST": "9.0a;12.0"}
    assert ext_plan.arch_environment("rocm", ["gfx90a"]) == {"PYTORCH_ROCM_ARCH": "gfx90a"}
    assert ext_plan.arch_environment("cpu", []) == {}
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        ext_plan.arch_environment("cuda", ["gfx90a"])


def test_extension_builds_only_the_detected_cuda_arch(monkeypatch: pytest.MonkeyPatch, fake_toolchain: Path) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(fake_toolchain.parent))
    spec, why = ext_plan.plan_build(CUDA_GPU)
    assert spec is not None, why
    assert spec.backend == "cuda" and spec.archs == ("sm_90",)
    assert dict(spec.arch_env) == {"TORCH_CUDA_ARCH_LIST": "9.0"}
    assert "ops_cuda.cu" in spec.sources
    pinned, _ = ext_plan.plan_build(CUDA_GPU, pinned_archs=["gfx90a", "sm_80"])
    assert pinned is not None and pinned.archs == ("sm_80",)


def test_extension_rocm_arch_honours_hsa_override(monkeypatch: pytest.MonkeyPatch, fake_toolchain: Path) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "ROCM_HOME", str(fake_toolchain.parent))
    gpu = replace(ROCM_GPU, arch="gfx1151")
    spec, _ = ext_plan.plan_build(gpu, environ={**os.environ, "HSA_OVERRIDE_GFX_VERSION": "11.0.0"})
    assert spec is not None and dict(spec.arch_env) == {"PYTORCH_ROCM_ARCH": "gfx1100"}
    detected, _ = ext_plan.plan_build(gpu, environ={k: v for k, v in os.environ.items()
                                               if k != "HSA_OVERRIDE_GFX_VERSION"})
    assert detected is not None and detected.archs == ("gfx1151",)
    assert detected.device_compiler_version == "HIP version: 0.0-test"


def test_extension_without_device_compiler_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    spec, why = ext_plan.plan_build(CUDA_GPU)
    assert spec is None and why.startswith("nvcc not found")


def test_extension_without_host_compiler_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CXX", "gpulab-no-such-compiler")
    load = ext_compile.build("t", device=CPU_TORCH, cache_root=tmp_path)
    assert load.status == "skipped" and "no host C++ compiler" in load.reason
    assert not (tmp_path / "extensions").exists()


# ------------------------------------------------------------------------------- cache key


def copy_sources(dest: Path) -> Path:
    shutil.copytree(ext_plan.SOURCE_DIR, dest)
    return dest


def test_build_dir_changes_exactly_with_sources_and_flags(tmp_path: Path) -> None:
    src = copy_sources(tmp_path / "src")
    base, _ = ext_plan.plan_build(CPU_TORCH, source_dir=src)
    same, _ = ext_plan.plan_build(CPU_TORCH, source_dir=copy_sources(tmp_path / "elsewhere"))
    flags, _ = ext_plan.plan_build(CPU_TORCH, extra_cflags=["-O2"], source_dir=src)
    assert base is not None and same is not None and flags is not None
    root = tmp_path / "cache"
    assert base.build_dir("t", root) == same.build_dir("t", root)
    assert base.build_dir("t", root).parent == root / "extensions" / "t"
    assert base.name != flags.name
    for header in ("ops_common.h", "ops_kernels.cuh"):  # the device header counts on CPU builds too
        (src / header).write_text((src / header).read_text() + "\n// an edit\n")
        edited, _ = ext_plan.plan_build(CPU_TORCH, source_dir=src)
        assert edited is not None and edited.name != base.name
        base = edited


def test_compiler_errors_keeps_the_compilers_lines() -> None:
    log = ("[1/2] c++ -c ops.cpp -o ops.o\nFAILED: ops.o\n"
           "ops.cpp:12:5: error: 'gpulab_broken' was not declared in this scope\n   12 |     gpulab_broken;\n"
           "      |     ^~~~~~~~~~~~~\nninja: build stopped: subcommand failed.\n")
    text = ext_compile.compiler_errors(log)
    assert "ops.cpp:12:5: error: 'gpulab_broken' was not declared" in text and "^~~~" in text
    assert "ninja: build stopped" not in text


# -------------------------------------------------------------------- real compilers, no GPU


@pytest.mark.slow
@pytest.mark.skipif(HIPCC is None, reason="hipcc not installed (CI installs Debian's hipcc)")
def test_standalone_compiles_with_hipcc_for_gfx90a_and_run_is_skipped_without_gpu(tmp_path: Path) -> None:
    rows = run_standalone(
        target="t", fingerprint="fp", build_config={"standalone_sizes": [1024], "offload_archs": ["gfx90a"]},
        timing=FAST, out_csv=tmp_path / "hip_standalone.csv", build_log=tmp_path / "b.log",
        run_log=tmp_path / "r.log", work_dir=tmp_path / "work", device=CPU_TORCH)
    build, run = rows
    assert build["status"] == "ok", build.get("reason")
    assert build["compiler"] == "hipcc" and "--offload-arch=gfx90a" in build["command"]
    assert build["binary_bytes"] > 0 and build["build_s"] > 0
    assert run["status"] == "skipped" and run["reason"].startswith("no AMD GPU")
    # The program itself refuses to pretend: non-zero exit and a runtime error naming the failed call.
    binary = next((tmp_path / "work").glob("vector_add_hipcc_gfx90a"))
    proc = subprocess.run([str(binary), "--sizes", "1024"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HIP_PLATFORM": "amd"})
    assert proc.returncode != 0
    assert "error" in proc.stderr.lower() and "RESULT" not in proc.stdout
    assert "the program reported" in run["reason"]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_standalone_source_compiles_with_nvcc_through_the_portability_header(tmp_path: Path) -> None:
    nvcc_dir = str(Path(NVCC).parent)
    rows = run_standalone(
        target="t", fingerprint="fp", build_config={"standalone_sizes": [1024], "offload_archs": ["sm_90"]},
        timing=FAST, out_csv=tmp_path / "hip_standalone.csv", build_log=tmp_path / "b.log",
        run_log=tmp_path / "r.log", work_dir=tmp_path / "work", device=device("cuda", False, cuda="13.0"),
        environ={"PATH": nvcc_dir})
    assert rows[0]["status"] == "ok", rows[0].get("reason")
    assert rows[0]["compiler"] == "nvcc" and "-arch=sm_90" in rows[0]["command"]
    assert rows[1]["status"] == "skipped" and rows[1]["reason"].startswith("no NVIDIA GPU")


@pytest.mark.slow
@pytest.mark.skipif(HIPCC is None, reason="hipcc not installed (CI installs Debian's hipcc)")
def test_broken_standalone_source_fails_with_the_compiler_message(tmp_path: Path) -> None:
    src = tmp_path / "hip"
    shutil.copytree(SOURCE.parent, src)
    broken = src / "vector_add.hip"
    broken.write_text(broken.read_text().replace("c4[i] = make_float4(", "c4[i] = gpulab_no_such_function("))
    rows = run_standalone(
        target="t", fingerprint="fp", build_config={"standalone_sizes": [1024], "offload_archs": ["gfx90a"]},
        timing=FAST, out_csv=tmp_path / "hip_standalone.csv", build_log=tmp_path / "b.log",
        run_log=tmp_path / "r.log", work_dir=tmp_path / "work", device=CPU_TORCH, source=broken)
    assert rows[0]["status"] == "failed"
    assert "compile error" in rows[0]["reason"] and "gpulab_no_such_function" in rows[0]["reason"]
    assert "gpulab_no_such_function" in (tmp_path / "b.log").read_text()
    assert rows[1]["status"] == "skipped" and rows[1]["reason"] == "the build failed"


def test_parse_output_of_the_h100_run() -> None:
    log = (FIXTURES / "results" / "h100" / "build" / "hip_standalone_run.log").read_text()
    dev, results = parse_output(log)
    assert dev["name"] == "NVIDIA H100 80GB HBM3" and dev["arch"] == "sm_90" and dev["warp_size"] == "32"
    assert [r["size"] for r in results] == [1024, 98432, 1048576, 16777216, 67108864]
    assert all(r["correct"] and r["mismatches"] == 0 and len(r["samples_ms"]) >= 10 for r in results)
    # Each timed size is judged stable or not by the rule every measured row follows.
    rows = [_measured(r, r["size"], FAST) for r in results]
    assert [row["stable"] for row in rows] == [is_stable(row["mean_ms"], row["median_ms"], row["cv"], row["reps"])
                                               for row in rows]
    assert all(row["stable"] is True for row in rows)  # 357-1000 repetitions, cv at most 0.04 on the H100


# ------------------------------------------------------------------------- the CPU extension


@pytest.fixture(scope="module")
def ext_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ext_cache")


def _built(root: Path, device_info: DeviceInfo) -> tuple[ext_compile.ExtensionLoad, Path, Path]:
    """A real build into the private cache (found there if built before), with its manifest."""
    load = ext_compile.build("ci", cache_root=root, device=device_info)
    if load.status == "skipped":
        pytest.skip(f"extension cannot be built here: {load.reason}")
    assert load.status == "ok", load.reason + load.compiler_output
    manifest = root / f"manifest_{load.name}.json"
    write_manifest(load, manifest)
    return load, root, manifest


@pytest.fixture(scope="module")
def cpu_extension(ext_cache: Path) -> tuple[ext_compile.ExtensionLoad, Path, Path]:
    """One real cold build of the CPU extension into a private cache, shared by the tests below."""
    return _built(ext_cache, CPU_TORCH)


@pytest.fixture(scope="module")
def extension_here(ext_cache: Path) -> tuple[ext_compile.ExtensionLoad, Path, Path]:
    """The build for this machine's device (the CPU build in CI: the same library as cpu_extension)."""
    return _built(ext_cache, detect())


@pytest.mark.slow
def test_cpu_extension_builds_cold_then_loads_warm_in_a_fresh_process(cpu_extension) -> None:
    load, root, manifest = cpu_extension
    assert load.backend == "cpu" and load.arch == "cpu" and load.build_s > 0
    assert load.reason == ""  # no private libstdc++ copy with Debian's compiler
    build_dir = Path(load.build_dir)
    assert build_dir.parent == root / "extensions" / "ci"
    assert json.loads((build_dir / "build.json").read_text())["name"] == load.name
    assert "ops.cpp" in (build_dir / "build.log").read_text()
    recorded = read_manifest(manifest)
    assert (recorded.library, recorded.digest, recorded.status) == (load.library, load.digest, "ok")
    warm = ext_step.warm_load_in_subprocess(manifest)
    assert warm.status == "ok", warm.reason
    assert warm.cached and warm.name == load.name and warm.build_s == pytest.approx(load.build_s)
    assert warm.seconds < load.build_s


@pytest.mark.slow
def test_cpu_extension_matches_pytorch(cpu_extension) -> None:
    rows = ext_checks.check_ops("ci", "fp", device=CPU_TORCH)
    table = ext_checks.EXTENSION_CHECKS.frame(rows)
    bad = table[table["status"] != "ok"]
    assert bad.empty, bad[["op", "dtype", "shape", "layout", "reason"]].to_string()
    assert set(table["op"]) == {"vector_add", "gelu_tanh", "softmax_rows"}
    assert set(table["dtype"]) == {"fp32", "fp16", "bf16"} and set(table["layout"]) == {"aligned", "offset"}
    assert (table["unwritten"] == 0).all()


@pytest.mark.slow
def test_correctness_check_catches_a_wrong_operator(cpu_extension, monkeypatch: pytest.MonkeyPatch) -> None:
    gelu_entry = ops.OPS["gelu"]

    def reference_off_by_a_thousandth(x):
        return gelu_entry.exact(x) * (1 + 1e-3)

    monkeypatch.setitem(ops.OPS, "gelu", replace(gelu_entry, exact=reference_off_by_a_thousandth))
    rows = ext_checks.check_ops("ci", "fp", device=CPU_TORCH, dtypes=("fp32",))
    gelu = [r for r in rows if r["op"] == "gelu_tanh"]
    assert gelu and all(r["status"] == "incorrect" for r in gelu), [r["shape"] for r in gelu if r["status"] == "ok"]
    assert all(r["status"] == "ok" for r in rows if r["op"] != "gelu_tanh")


@pytest.mark.slow
def test_cpu_extension_ops_work_under_torch_compile(cpu_extension) -> None:
    import torch

    def f(x, y):
        return torch.ops.gpulab.softmax_rows(torch.ops.gpulab.gelu_tanh(torch.ops.gpulab.vector_add(x, y)))

    x, y = torch.randn(5, 37), torch.randn(5, 37)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, y), f(x, y))
    expected = torch.softmax(torch.nn.functional.gelu(x + y, approximate="tanh"), -1)
    torch.testing.assert_close(f(x, y), expected, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def bad_input_rows(extension_here) -> dict[str, dict]:
    """Every bad-input case on this machine's device, each in its own process (as the step runs them)."""
    _, _, manifest = extension_here
    rows = ext_checks.check_bad_inputs("ci", "fp", manifest)
    for r in rows:  # the messages, for whoever reads the test output (-s / -rA)
        print(f"{r['case']:32} {r['status']:8} {r.get('message') or r.get('reason')}")
    return {r["case"]: r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("case", ext_checks.BAD_CASES, ids=lambda c: c.name)
def test_bad_input_is_refused_with_a_clear_message_never_a_crash(bad_input_rows, case) -> None:
    row = bad_input_rows[case.name]
    if case.needs_gpu and not detect().gpu_available:
        assert row["status"] == "skipped" and "needs a GPU" in row["reason"]
        return
    assert row["status"] == "ok", f"{row['reason']}\nmessage: {row.get('message')}"
    if case.expect:  # a RuntimeError naming the problem and the offending tensor
        assert all(e in row["message"] for e in (*case.expect, *ext_checks.MESSAGE_MUST_NAME)), row["message"]
    else:
        assert row["message"].startswith("returned shape")


@pytest.mark.slow
def test_bad_input_crash_is_recorded_as_failed_with_the_signal(extension_here, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    crasher = tmp_path / "python"
    crasher.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crasher.chmod(0o755)
    monkeypatch.setattr(ext_checks.sys, "executable", str(crasher))
    rows = ext_checks.check_bad_inputs("ci", "fp", extension_here[2], device=CPU_TORCH,
                                       cases=ext_checks.BAD_CASES[:2])
    assert [r["status"] for r in rows] == ["failed", "failed"]
    assert all("killed by signal 11 (SIGSEGV)" in r["reason"] for r in rows), rows


@pytest.mark.slow
def test_bad_input_messages_survive_a_private_libstdcxx_copy(ext_cache: Path) -> None:
    """The H100 failure on a CPU: the H100 machine's host compiler links libstdc++ into the extension, and
    formatting a number through a C++ stream there crashed every bad-input message naming a shape. Linked
    the same way here (-static-libstdc++), the build is flagged and every message still names the numbers."""
    manifest = ext_cache / "manifest_static_libstdcxx.json"
    script = f"""
from pathlib import Path
from gpulab.native import build, write_manifest
from gpulab.core.device import DeviceInfo
cpu = DeviceInfo(backend="cpu", torch_version="t", hip_version=None, cuda_version=None, gpu_available=False)
load = build("ci", device=cpu, cache_root=Path(r"{ext_cache}"), extra_ldflags=["-static-libstdc++"])
write_manifest(load, Path(r"{manifest}"))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = read_manifest(manifest)
    if built.status == "skipped":
        pytest.skip(built.reason)
    assert built.status == "ok" and "private copy of libstdc++" in built.reason, built.reason
    rows = ext_checks.check_bad_inputs("ci", "fp", manifest, device=CPU_TORCH)
    bad = [r for r in rows if r["status"] not in ("ok", "skipped")]
    assert not bad, "\n".join(f"{r['case']}: {r['reason']} | {r.get('message')}" for r in bad)


@pytest.mark.slow
def test_private_libstdcxx_copy_is_detected_and_breaks_number_formatting(tmp_path: Path) -> None:
    """Why the note exists: a library with its own libstdc++ cannot format a long through a stream."""
    import ctypes

    import torch  # noqa: F401  (the process's own libstdc++ is loaded first, as in a workflow step)

    source = tmp_path / "fmt.cpp"
    source.write_text('#include <sstream>\n#include <cstring>\nextern "C" void fmt(long v, char* out, int n) '
                      '{ std::ostringstream s; s << "[" << v << "]"; std::strncpy(out, s.str().c_str(), n); }\n')
    built = {}
    for name, flags in (("static", ["-static-libstdc++"]), ("shared", [])):
        lib = tmp_path / f"fmt_{name}.so"
        proc = subprocess.run(["c++", "-O2", "-fPIC", "-shared", *flags, str(source), "-o", str(lib)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"cannot link with {flags}: {proc.stderr[-300:]}")
        built[name] = lib
    assert ext_compile.private_libstdcxx_note(built["static"]).startswith("note: the host compiler linked")
    assert ext_compile.private_libstdcxx_note(built["shared"]) == ""
    buf = ctypes.create_string_buffer(32)
    ctypes.CDLL(str(built["shared"])).fmt(ctypes.c_long(42), buf, 32)
    assert buf.value == b"[42]"
    ctypes.CDLL(str(built["static"])).fmt(ctypes.c_long(42), buf, 32)
    assert buf.value != b"[42]"  # '[' only: the number is lost (the H100's libstdc++ pair crashes instead)


def test_bad_input_judge_rejects_vague_messages() -> None:
    case = ext_checks.CASES["softmax_rows_3d"]
    vague = {"raised": "RuntimeError", "message": "gpulab::softmax_rows: bad input", "shape": "2x3x4"}
    status, reason = ext_checks.judge(case, vague)
    assert status == "failed" and "must be 2-D" in reason
    assert ext_checks.judge(case, {"raised": "TypeError", "message": "x"})[0] == "failed"
    empty = ext_checks.CASES["softmax_rows_no_rows"]
    assert ext_checks.judge(empty, {"raised": "RuntimeError", "message": "no"})[0] == "failed"


@pytest.mark.slow
def test_manifest_loader_never_builds_and_says_why(cpu_extension, tmp_path: Path) -> None:
    load = cpu_extension[0]
    missing = load_from_manifest(tmp_path / "none.json")
    assert missing.status == "failed" and "run the extension_build step" in missing.reason
    gone = tmp_path / "gone.json"
    write_manifest(replace(load, library=str(tmp_path / "deleted" / "gpulab_ops_x.so")), gone)
    stale = load_from_manifest(gone)
    assert stale.status == "failed" and "is missing" in stale.reason and "extension_build" in stale.reason
    skipped = tmp_path / "skipped.json"
    write_manifest(ext_compile.ExtensionLoad("skipped", "no host C++ compiler", "t"), skipped)
    assert load_from_manifest(skipped).status == "skipped"
    assert not (tmp_path / "deleted").exists()  # nothing was rebuilt


@pytest.mark.slow
@pytest.mark.skipif(HIPCC is None, reason="hipcc not installed (CI installs Debian's hipcc)")
def test_extension_device_code_compiles_for_amd_with_hipcc(tmp_path: Path) -> None:
    source = ext_plan.SOURCE_DIR / "ops_kernels_hip.hip"
    out = tmp_path / "ops_kernels_gfx90a.o"
    proc = subprocess.run(["hipcc", "-std=c++17", "-O3", "--offload-arch=gfx90a", "-c", str(source), "-o", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HIP_PLATFORM": "amd"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.stat().st_size > 100_000  # host stubs plus the gfx90a code object of every kernel


def test_gelu_constant_is_written_once_in_the_extension_sources() -> None:
    kappa = "0.04" + "4715"  # spelled apart so this test is not a hit itself
    hits = [p.name for p in ext_plan.SOURCE_DIR.iterdir() for line in p.read_text().splitlines() if kappa in line]
    assert hits == ["ops_common.h"]


@pytest.mark.slow
def test_timing_pitfalls_rows_on_cpu(cpu_extension, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulab.native.timing_pitfalls import PITFALLS, run_pitfalls

    _, _, manifest = cpu_extension
    rows = run_pitfalls("ci", "fp", FAST, manifest=manifest, size=1 << 16, device=CPU_TORCH)
    table = PITFALLS.frame(rows)
    assert (table["status"] == "ok").all(), table["reason"].tolist()
    assert list(table["method"]) == ["tutorial"] * 2 + ["tutorial_reversed"] * 2 + ["measured"] * 2
    tutorial = table[table["method"] == "tutorial"]
    assert list(tutorial["impl"]) == ["cpp_ext", "native"] and list(tutorial["call_order"]) == [1, 2]
    assert list(table[table["method"] == "tutorial_reversed"]["impl"]) == ["native", "cpp_ext"]
    assert (tutorial["reps"] == 1).all() and (tutorial["timer"] == "host_clock").all()
    measured = table[table["method"] == "measured"]
    assert (measured["reps"] >= 3).all() and (measured["timer"] == "perf_counter").all()
    assert table["correct"].all()


def test_the_pitfalls_figure_names_the_timer_the_measured_rows_used() -> None:
    from gpulab.report.sections.build import method_label

    assert "host clock" in method_label("measured", "perf_counter")
    assert "device events" in method_label("measured", "device_event")
    assert "device" not in method_label("tutorial", "host_clock")


@pytest.mark.slow
def test_broken_kernel_source_fails_the_step_with_the_compiler_message(tmp_path: Path) -> None:
    src = copy_sources(tmp_path / "src")
    ops = src / "ops.cpp"
    ops.write_text(ops.read_text().replace("at::Tensor out = at::empty_like(a);",
                                           "at::Tensor out = gpulab_no_such_symbol(a);", 1))
    script = f"""
import sys
from pathlib import Path
from gpulab.core.device import DeviceInfo
from gpulab.native.step import run_extension_step
cpu = DeviceInfo(backend="cpu", torch_version="t", hip_version=None, cuda_version=None, gpu_available=False)
run_extension_step("ci", "fp", {{}}, out_csv=Path(r"{tmp_path}/extension.csv"),
                   checks_csv=Path(r"{tmp_path}/checks.csv"), build_log=Path(r"{tmp_path}/build.log"),
                   manifest=Path(r"{tmp_path}/manifest.json"), cache_root=Path(r"{tmp_path}/cache"), device=cpu,
                   source_dir=Path(r"{src}"))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    if "no host C++ compiler" in proc.stdout + proc.stderr:
        pytest.skip("no host C++ compiler")
    assert proc.returncode != 0
    # The compiler's own diagnostic, file and line included, not just a Python traceback.
    assert re.search(r"ops\.cpp:\d+:\d+: error: .*gpulab_no_such_symbol", proc.stderr), proc.stderr[-3000:]
    assert "ExtensionBuildError" in proc.stderr
    assert not any((tmp_path / n).exists() for n in ("extension.csv", "checks.csv", "manifest.json"))
    build_dir = next((tmp_path / "cache" / "extensions" / "ci").glob("gpulab_ops_*"))
    assert not (build_dir / "build.json").exists()  # never mistaken for a finished build


# ------------------------------------------------------------------------------------ report


def test_build_section_renders_gpu_and_cpu_results(tmp_path: Path) -> None:
    import yaml

    from gpulab.report.render import render_report
    from gpulab.workflow.config import validate_config

    config = validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))
    out = tmp_path / "report.html"
    render_report(FIXTURES / "results", out, config, "pytest")
    page = out.read_text()
    start = page.index('id="build"')
    section = page[start:page.index("</section>", start)]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", section))
    assert "246 of 246 cases within tolerance" in text  # H100
    assert "192 of 192 cases within tolerance" in text  # CPU
    assert "17 of 17 bad-input cases refused with a clear message" in text and "1 skipped" in text  # CPU
    assert "must be contiguous, got strides [1, 48]" in text
    assert "an apparent 8.7× speed-up" in text and "the native add is 0.7% faster" in text
    assert "Run skipped: no AMD GPU" in text and "hipErrorNoDevice" in text
    assert "11.4" in text and "sm_90" in text and "gfx90a" in text
    assert section.count("data:image/png;base64,") == 2
    assert 'href="' in section and "extension_build.log" in section


def test_fixture_tables_match_their_schemas() -> None:
    from gpulab.native.timing_pitfalls import PITFALLS

    for target in ("h100", "local-cpu"):
        base = FIXTURES / "results" / target / "build"
        for schema, name in ((HIP_STANDALONE, "hip_standalone.csv"), (ext_step.EXTENSION, "extension.csv"),
                             (ext_checks.EXTENSION_CHECKS, "extension_checks.csv"), (PITFALLS, "timing_pitfalls.csv")):
            df = schema.read(base / name)
            assert list(df.columns) == schema.names, f"{target}/{name}"
    with pytest.raises(SchemaError):
        PITFALLS.read(FIXTURES / "results" / "h100" / "build" / "extension.csv")


def test_one_finder_says_where_the_device_compiler_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulab.core.tools import find_compiler
    from gpulab.toolchains.archs import arch
    from gpulab.toolchains.hipcc import toolchain

    bin_dir = tmp_path / "rocm" / "bin"
    bin_dir.mkdir(parents=True)
    hipcc = bin_dir / "hipcc"
    hipcc.write_text("#!/bin/sh\n")
    hipcc.chmod(0o755)
    env = {"PATH": str(tmp_path / "nothing"), "ROCM_PATH": str(tmp_path / "rocm")}
    assert find_compiler("hipcc", env) == str(hipcc)  # not on PATH: the toolkit's bin directory
    assert find_compiler("hipcc", env, toolkit_dirs=False) is None
    assert find_compiler("hipcc", {"PATH": str(bin_dir)}, toolkit_dirs=False) == str(hipcc)
    assert find_compiler("hipcc", env, homes=[str(tmp_path / "rocm")]) == str(hipcc)  # a pinned toolkit only
    assert find_compiler("hipcc", {"PATH": str(bin_dir)}, homes=[None]) is None
    monkeypatch.setenv("PATH", str(bin_dir))
    found = toolchain("hipcc", arch("gfx90a"), tmp_path)  # the AMD kernel table asks the same finder
    assert not isinstance(found, str) and found.exe == str(hipcc)
    hipcc.chmod(0o644)
    assert find_compiler("hipcc", env) is None and isinstance(toolchain("hipcc", arch("gfx90a"), tmp_path), str)
