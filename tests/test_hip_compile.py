"""HIP C++ for the study's iGPU and the datacentre GPUs without either: every HIP unit (the standalone program, the
extension's device unit, and the extension's CUDA unit hipified as PyTorch's ROCm build does) compiled by clang for
gfx1151, gfx1100, gfx942 and gfx90a against the ROCm device libraries, the wave32/wave64 launch choices checked per
family, the compiler's own resource remarks against the table, and the ISA-version library built as ROCm builds it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from gpulab.core.parallel import run_all
from gpulab.toolchains import device_libs, hipcc
from gpulab.toolchains.archs import ARCHS, arch, warps_per_simd_by_registers
from gpulab.toolchains.hipcc import CLANG, compile_source, hip_sources
from gpulab.toolchains.job import default_cache_dir, hip_tasks, with_arch_figures
from gpulab.toolchains.resources import amdgcn_kernels

AMD = [name for name, a in ARCHS.items() if a.backend == "hip"]
HIPIFIED = "kernels/ext/ops_cuda.cu (hipified)"
needs_clang = pytest.mark.skipif(shutil.which(CLANG) is None or shutil.which(hipcc.LLD) is None
                                 or device_libs.installed_dir() is None,
                                 reason=f"needs {CLANG}, {hipcc.LLD} and rocm-device-libs ({hipcc.CLANG_HINT} "
                                        "rocm-device-libs)")


@pytest.fixture(scope="module")
def hip_table() -> pd.DataFrame:
    """Every HIP row of the four AMD architectures, through the rule's own tasks (outcomes cached in .cache/)."""
    rows = []
    for name in AMD:
        a = arch(name)
        for task_rows in run_all(hip_tasks(a, default_cache_dir()), os.cpu_count() or 1):
            rows += [with_arch_figures(row, a) for row in task_rows]
    return pd.DataFrame(rows)


@needs_clang
@pytest.mark.slow
def test_every_hip_unit_compiles_for_every_amd_arch(hip_table):
    clang = hip_table[hip_table["compiler"].str.startswith("clang ")]
    assert (clang["status"] == "ok").all(), clang[clang["status"] != "ok"][["arch", "source", "reason"]]
    sources = {"kernels/hip/vector_add.hip", "kernels/ext/ops_kernels_hip.hip", HIPIFIED}
    for name in AMD:
        rows = clang[clang["arch"] == name]
        assert set(rows["source"]) == sources, name
        assert (rows["registers"] > 0).all() and (rows["sgprs"] > 0).all() and (rows["code_bytes"] > 0).all()
        assert rows["occupancy"].between(0, 1, inclusive="right").all()
        # The extension's unit as PyTorch compiles it holds the same 77 kernels as the standalone unit.
        assert (rows["source"] == HIPIFIED).sum() == (rows["source"] == "kernels/ext/ops_kernels_hip.hip").sum()
    hipcc_rows = hip_table[hip_table["compiler"].str.startswith("hipcc")]
    assert set(hipcc_rows["arch"]) <= {"gfx90a"} and (hipcc_rows["status"] == "ok").all()


_WARP_ARG = re.compile(r"softmax_(block|split|looped)_kernel<([^,]+), (\d+)")


@needs_clang
@pytest.mark.slow
def test_wave64_and_wave32_families_launch_their_own_kernels(hip_table):
    """The extension picks its softmax kernels by the device's wavefront width (launch_softmax_for_warp): on CDNA
    the WARP=64 instantiations, on RDNA the WARP=32 ones, whose cross-lane reductions span exactly one wavefront.
    Both families' code objects hold them (compiled as wave64 / wave32, else the row fails), the 256-thread
    elementwise blocks are 4 waves on CDNA and 8 on RDNA, and no vectorised kernel a family launches spills."""
    ext = hip_table[hip_table["source"] == HIPIFIED]
    for name in AMD:
        a = arch(name)
        rows = ext[ext["arch"] == name]
        launched = rows[[bool(m) and int(m[3]) == a.warp_size
                         for m in (_WARP_ARG.search(k) for k in rows["kernel"])]]
        kinds = {(_WARP_ARG.search(k)[1], _WARP_ARG.search(k)[2], k.endswith("true>")) for k in launched["kernel"]}
        assert len(kinds) == 3 * 3 * 2, (name, sorted(kinds))  # block/split/looped x 3 dtypes x vector or scalar
        vectorised = launched[launched["kernel"].str.endswith("true>")]
        assert (vectorised["spilled_regs"] == 0).all(), vectorised[["kernel", "spilled_regs"]]
        elementwise = rows[rows["kernel"].str.contains("binary_vec_kernel|unary_vec_kernel")]
        assert (elementwise["num_warps"] == 256 // a.warp_size).all(), name


_REMARK = re.compile(r"remark: [^:]+:\d+:\d+:\s+(.+?): (\S+) \[-Rpass-analysis=kernel-resource-usage\]")


def _remarks(stderr: str) -> dict[str, dict[str, str]]:
    kernels: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for key, value in _REMARK.findall(stderr):
        if key == "Function Name":
            current = kernels.setdefault(value, {})
        else:
            current[key] = value
    return kernels


@needs_clang
@pytest.mark.parametrize("name", ["gfx1151", "gfx942"])
def test_the_compilers_resource_remarks_agree_with_the_table(name, tmp_path):
    """clang's -Rpass-analysis=kernel-resource-usage, on the same compile the table makes, names the table's
    VGPRs, SGPRs, scratch and LDS, and the waves per SIMD our occupancy arithmetic gives."""
    a = arch(name)
    source = hip_sources()[0]
    tc = hipcc.toolchain("clang", a, default_cache_dir())
    out = tmp_path / "device.o"
    cmd = [*tc.command(source, a, out, hipcc.SOURCE_FLAGS), "-Rpass-analysis=kernel-resource-usage"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp_path)
    remarks = _remarks(result.stderr)
    figures = amdgcn_kernels(next(tmp_path.glob(f"*-{name}*.s")).read_text())
    assert set(remarks) == set(figures) and remarks
    for symbol, noted in remarks.items():
        ours = figures[symbol]
        vgprs = int(noted["VGPRs"]) + int(noted.get("AGPRs", 0))  # RDNA has no AGPRs and no remark for them
        assert (vgprs, int(noted["SGPRs"])) == (ours["registers"], ours["sgprs"])
        assert (int(noted["ScratchSize [bytes/lane]"]), int(noted["LDS Size [bytes/block]"])) == (
            ours["scratch_bytes"], ours["lds_bytes"])
        assert int(noted["Occupancy [waves/SIMD]"]) == warps_per_simd_by_registers(a, ours["registers"], ours["sgprs"])
    rows = compile_source(source, a, tmp_path / "cache")
    assert [(r["registers"], r["sgprs"]) for r in rows] == [(f["registers"], f["sgprs"]) for f in figures.values()]


def _isa_constant(clang: str, library: Path) -> int:
    ir = subprocess.run([clang, "-x", "ir", "-S", "-emit-llvm", "--target=amdgcn-amd-amdhsa", "-nogpulib", "-o", "-",
                         str(library)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"@__oclc_ISA_version = .*constant i32 (\d+)", ir)[1])


@needs_clang
def test_the_built_isa_library_is_the_distributions_own(tmp_path):
    """Built for gfx90a, which Debian ships, the library defines the same constant and links into the same code as
    the distribution's: the recipe is the library's own, so the gfx942/gfx1100/gfx1151 ones are too."""
    clang, installed = shutil.which(CLANG), device_libs.installed_dir()
    ours = tmp_path / "ours"
    ours.mkdir()
    for lib in installed.glob("*.bc"):
        (ours / lib.name).symlink_to(lib)
    built = ours / device_libs.isa_library("gfx90a")
    built.unlink()
    device_libs.build_isa_library(clang, "gfx90a", built)
    assert _isa_constant(clang, built) == _isa_constant(clang, installed / built.name) == 9010
    kernel = tmp_path / "tanh.hip"  # ocml's tanh reads __oclc_ISA_version
    kernel.write_text("#include <hip/hip_runtime.h>\n"
                      "__global__ void k(float* x) { x[threadIdx.x] = tanhf(x[threadIdx.x]); }\n")
    asm = []
    for libdir in (installed, ours):
        out = tmp_path / f"{libdir.name}.s"
        subprocess.run([clang, "-x", "hip", "--offload-arch=gfx90a", "--cuda-device-only", "-O3", "-S", "-cuid=same",
                        f"--rocm-device-lib-path={libdir}", "-o", str(out), str(kernel)], check=True)
        asm.append(out.read_text())
    assert asm[0] == asm[1]
    for name in ("gfx942", "gfx1100", "gfx1151"):
        overlay = device_libs.device_lib_dir(clang, name, tmp_path / "cache")
        assert _isa_constant(clang, overlay / device_libs.isa_library(name)) == device_libs.ISA_VERSIONS[name]


def test_a_missing_toolchain_is_a_skipped_row_with_the_install_command(monkeypatch, tmp_path):
    a = arch("gfx1151")
    source = hip_sources()[0]
    real_which = shutil.which
    monkeypatch.setattr(hipcc.shutil, "which", lambda exe: None if exe == CLANG else real_which(exe))
    row, = compile_source(source, a, tmp_path)
    assert row["status"] == "skipped" and "apt-get install clang-19 lld-19" in row["reason"]
    monkeypatch.setattr(hipcc.shutil, "which", lambda exe: f"/usr/bin/{exe}")
    monkeypatch.setattr(device_libs, "SEARCH", ())
    monkeypatch.setenv("HIP_DEVICE_LIB_PATH", str(tmp_path))
    row, = compile_source(source, a, tmp_path)
    assert row["status"] == "skipped" and "apt-get install rocm-device-libs" in row["reason"]
