from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from gpulab.core.smi import parse_nvidia_smi_q, parse_rocm_smi_json, parse_rocminfo
from gpulab.core.tools import ToolResult, run_tool
from gpulab.env.capture import (
    _no_device_on_empty_output,
    _no_device_when_kernel_driver_absent,
    capture,
    fingerprint_id,
)
from gpulab.env.runtime_stack import RUNTIME_STACK, classify, parse_ldd, stack_rows

STUDY_TORCH_LIB = "/opt/venv/lib/python3.13/site-packages/torch/lib"


def test_study_rocm_ldd_listing_classifies(fixtures):
    text = (fixtures / "env/ldd_libtorch_python_rocm_study.txt").read_text()
    rows = {r["library"]: r for r in stack_rows([("libtorch_python.so", text)], STUDY_TORCH_LIB)}
    expected = {
        "libtorch_hip.so": ("framework", "torch wheel"),
        "libc10_hip.so": ("framework", "torch wheel"),
        "libamdhip64.so.7": ("gpu_runtime", "system"),
        "libhiprtc.so.7": ("compiler", "system"),
        "libamd_comgr.so.3": ("compiler", "system"),
        "libhsa-runtime64.so.1": ("hsa_runtime", "system"),
        "libdrm_amdgpu.so.1": ("driver", "system"),
        "libhipblas.so.3": ("math", "system"),
        "libhipblaslt.so.1": ("math", "system"),
        "libhipfft.so.0": ("math", "system"),
        "libhipsparselt.so.0": ("math", "system"),
    }
    for lib, (layer, origin) in expected.items():
        assert (rows[lib]["layer"], rows[lib]["origin"]) == (layer, origin), lib
    assert all(r["vendor"] in {"amd", "pytorch"} for r in rows.values())
    assert len(rows) == 14


@pytest.mark.parametrize(
    ("soname", "layer"),
    [
        ("libcudart.so.13", "gpu_runtime"),
        ("libcublasLt.so.13", "math"),
        ("libcudnn.so.9", "math"),
        ("libnccl.so.2", "communication"),
        ("libnvrtc.so.13", "compiler"),
        ("libcuda.so.1", "driver"),
        ("libcupti.so.13", "profiling"),
        ("librocblas.so.4", "math"),
        ("libMIOpen.so.1", "math"),
        ("librccl.so.1", "communication"),
        ("libroctracer64.so.4", "profiling"),
        ("libc.so.6", "system"),
        ("libtorch_cuda.so", "framework"),
    ],
)
def test_classify_cuda_and_rocm_libraries(soname, layer):
    assert classify(soname)[0] == layer


def test_parse_ldd_variants():
    text = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibfoo.so.1 => not found\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
    )
    entries = parse_ldd(text)
    assert [(e.library, e.path) for e in entries] == [
        ("linux-vdso.so.1", ""),
        ("libfoo.so.1", None),
        ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ("ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"),
    ]


def test_rocm_smi_json_parsers(fixtures):
    new = parse_rocm_smi_json((fixtures / "env/rocm_smi_json_radeon8060s.json").read_text())
    assert new["driver_version"] == "6.16.6"
    assert new["devices"][0]["product"] == "AMD Radeon 8060S"
    assert new["devices"][0]["gfx_version"] == "gfx1151"
    assert new["devices"][0]["vram_total_bytes"] == 67108864000
    old = parse_rocm_smi_json((fixtures / "env/rocm_smi_json_mi210_rocm52.json").read_text())
    assert old["devices"][0]["product"].endswith("[Instinct MI210]")
    assert old["driver_version"] == "5.18.13"
    assert parse_rocm_smi_json("") == {"devices": [], "driver_version": None}


def test_rocminfo_parser(fixtures):
    gpus = parse_rocminfo((fixtures / "env/rocminfo_gfx1151.txt").read_text())
    assert gpus == [{"name": "gfx1151", "marketing_name": "AMD Radeon 8060S", "compute_units": "40", "vendor": "AMD"}]
    assert parse_rocminfo((fixtures / "env/rocminfo_no_gpu.stdout").read_text()) == []


def _recorded_without_gpu(fixtures, tool: str, status: str, code: int, reason: str) -> ToolResult:
    """What ``tool`` printed on the CPU-only dev machine (tests/fixtures/env/<tool>_no_gpu.*)."""
    stem = fixtures / "env" / f"{tool.replace('-', '_')}_no_gpu"
    return ToolResult(tool, (tool,), status, code, reason, stem.with_suffix(".stdout").read_text(),
                      stem.with_suffix(".stderr").read_text())


def test_rocm_smi_without_gpu_is_no_device(fixtures):
    recorded = _recorded_without_gpu(fixtures, "rocm-smi", "ok", 0, "")
    result = _no_device_on_empty_output(recorded)
    assert result.status == "skipped"
    assert result.reason.startswith("no AMD GPU: ") and "amdgpu not found" in result.reason


def test_nvidia_smi_parser_h100(fixtures):
    path = fixtures / "env/nvidia_smi_q_h100.txt"
    if not path.exists():
        pytest.skip("H100 nvidia-smi fixture not recorded yet")
    parsed = parse_nvidia_smi_q(path.read_text())
    assert parsed["driver_version"] and parsed["cuda_version"]
    assert parsed["devices"][0]["product"].startswith("NVIDIA H100")
    assert parsed["devices"][0]["memory_total"].endswith("MiB")


def test_cuda_ldd_fixture_classifies(fixtures):
    path = fixtures / "env/ldd_libtorch_cuda_h100.txt"
    if not path.exists():
        pytest.skip("H100 ldd fixture not recorded yet")
    rows = stack_rows([("libtorch_cuda.so", path.read_text())], None)
    layers = {r["library"].split(".so")[0]: r["layer"] for r in rows}
    assert layers["libcudart"] == "gpu_runtime"
    assert layers["libcublas"] == "math"
    assert not any(r["vendor"] == "amd" for r in rows)


def test_run_tool_outcomes(tmp_path):
    assert run_tool("x", ["definitely-not-a-tool-xyz"]).status == "skipped"
    failing = run_tool("false", ["sh", "-c", "echo bad >&2; exit 3"])
    assert (failing.status, failing.exit_status) == ("failed", 3) and "bad" in failing.reason
    slow = run_tool("sleep", ["sleep", "5"], timeout_s=0.2)
    assert slow.status == "failed" and "timed out" in slow.reason


def test_fingerprint_ignores_time_host_and_config():
    env = {"os": 1, "cpu": 2, "python": 3, "packages": 4, "device": 5, "compilers": 6, "git": 7}
    assert fingerprint_id({**env, "captured_at": "x", "host": "a"}) == fingerprint_id({**env, "captured_at": "y"})
    # The fingerprint describes the machine and software; the configuration is recorded per step instead.
    assert fingerprint_id(env) == fingerprint_id({**env, "config_hash": "b"})
    assert fingerprint_id(env) != fingerprint_id({**env, "packages": 5})


def test_capture_on_this_machine(tmp_path):
    env = capture(tmp_path, target="t1", timeout_s=60)
    saved = json.loads((tmp_path / "env.json").read_text())
    assert saved["fingerprint"] == env["fingerprint"] == fingerprint_id(saved)
    tools = pd.read_csv(tmp_path / "tools.csv")
    assert {
        "rocm-smi",
        "rocminfo",
        "nvidia-smi",
        "hipcc",
        "nvcc",
        "collect_env",
        "pip-freeze",
        "ldd:libtorch_python.so",
    } <= set(tools["tool"])
    assert set(tools["status"]) <= {"ok", "skipped", "failed"}
    # Every tool left a raw record, and every non-ok outcome says why.
    for row in tools.itertuples():
        assert (tmp_path / row.raw_file).exists()
        if row.status != "ok":
            assert isinstance(row.reason, str) and row.reason
    if shutil.which("rocm-smi") and not saved["device"]["gpu_available"]:
        rocm = tools.set_index("tool").loc["rocm-smi"]
        assert rocm["status"] == "skipped" and rocm["reason"].startswith("no AMD GPU")
    stack = RUNTIME_STACK.read(tmp_path / "runtime_stack.csv")
    assert "libtorch_cpu.so" in set(stack["library"]) or "libtorch.so" in set(stack["library"])


def test_rocminfo_without_amdgpu_module_is_no_device(fixtures):
    recorded = _recorded_without_gpu(fixtures, "rocminfo", "failed", 1, "exit status 1")
    result = _no_device_when_kernel_driver_absent(recorded)
    assert result.status == "skipped" and result.reason.startswith("no AMD GPU")
    broken = ToolResult("rocminfo", ("rocminfo",), "failed", 1, "exit status 1", "", "segfault")
    assert _no_device_when_kernel_driver_absent(broken).status == "failed"
