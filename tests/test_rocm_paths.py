"""The study's ROCm paths without an AMD GPU: recorded ROCm tool outputs into env rows (an iGPU's VRAM carve-out
beside its GTT pool), the study's extension build line against PyTorch's own ROCm flags, and
HSA_OVERRIDE_GFX_VERSION for builds that lack gfx1151."""

from __future__ import annotations

import re
import shlex

import pytest

from gpulab.core.device import DeviceInfo, gfx_from_override, offload_archs
from gpulab.core.smi import MIB, parse_amd_smi, parse_rocm_smi_json, parse_rocminfo
from gpulab.env.capture import gpu_memory
from gpulab.report.sections.environment import _versions


@pytest.fixture
def rocm(fixtures):
    return fixtures / "rocm"


def test_rocm_smi_meminfo_all_gives_vram_and_gtt(rocm):
    parsed = parse_rocm_smi_json((rocm / "rocm_smi_all_json_rx6700xt_rocm612.json").read_text())
    card = parsed["devices"][0]
    assert parsed["driver_version"] == "6.3.6" and card["gfx_version"] == "gfx1031"
    assert (card["vram_total_bytes"], card["vram_used_bytes"]) == (12868124672, 1572745216)
    assert (card["gtt_total_bytes"], card["gtt_used_bytes"]) == (16792432640, 242036736)
    assert card["product"] == "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"


def test_amd_smi_text_and_json_agree_on_an_apus_pools(rocm):
    text = parse_amd_smi((rocm / "amd_smi_metric_mem_apu.txt").read_text())
    json_form = parse_amd_smi((rocm / "amd_smi_metric_mem_apu.json").read_text())
    assert text == json_form
    apu = text[0]
    assert apu["vram_total_bytes"] == 512 * MIB and apu["gtt_total_bytes"] == 13649 * MIB
    assert (apu["vram_used_bytes"], apu["gtt_used_bytes"]) == (489 * MIB, 964 * MIB)
    assert parse_amd_smi("") == []


def test_amd_smi_static_size_fills_vram_and_na_is_none():
    static = '[{"gpu": 0, "asic": {"market_name": "AMD Radeon 8060S Graphics"}, ' \
             '"vram": {"type": "LPDDR5", "size": {"value": 512, "unit": "MB"}}}, {"gpu": 1, "asic": "N/A"}]'
    first, second = parse_amd_smi(static)
    assert (first["product"], first["vram_type"], first["vram_total_bytes"]) == (
        "AMD Radeon 8060S Graphics", "LPDDR5", 512 * MIB)
    assert second["product"] is None and second["gtt_total_bytes"] is None


def test_env_memory_pools_reach_the_report(rocm):
    """An iGPU's memory in env.json and the environment section: the carve-out beside the mapped host memory."""
    smi = {"amd_smi": parse_amd_smi((rocm / "amd_smi_metric_mem_apu.txt").read_text()),
           "rocm_smi": parse_rocm_smi_json((rocm / "rocm_smi_all_json_rx6700xt_rocm612.json").read_text())}
    memory = gpu_memory(smi)
    assert memory["source"] == "amd-smi" and memory["gtt_total_bytes"] == 13649 * MIB
    rows = _versions({"gpu_memory": memory, "device": {"backend": "rocm"}})
    assert rows["GPU memory: VRAM"] == "0.5 GiB, 0.5 GiB used (amd-smi)"
    assert rows["GPU memory: GTT (host memory mapped for the GPU)"] == "13.3 GiB, 0.9 GiB used (amd-smi)"
    only_rocm_smi = gpu_memory({"rocm_smi": smi["rocm_smi"]})
    assert only_rocm_smi["source"] == "rocm-smi" and only_rocm_smi["gtt_used_bytes"] == 242036736
    assert gpu_memory({}) is None


def test_recorded_rocminfo_of_a_strix_halo(rocm):
    gpus = parse_rocminfo((rocm / "rocminfo_gfx1151_agent.txt").read_text())
    assert [(g["name"], g["marketing_name"]) for g in gpus] == [("gfx1151", "AMD Radeon 8060S Graphics")]


def _study_command(rocm) -> list[str]:
    return shlex.split((rocm / "hipcc_extension_command_study.txt").read_text())


def test_the_study_build_line_is_pytorchs_rocm_flags_for_its_arch_list(rocm):
    """PyTorch's own ROCm flags, with PYTORCH_ROCM_ARCH set to the study's eleven architectures, give the study's
    --offload-arch list, and the same defines (the study's Markdown dropped their double underscores)."""
    pytest.importorskip("torch")
    from gpulab.toolchains.rocm_extension import device_flags

    study = _study_command(rocm)
    archs = [f.split("=", 1)[1] for f in study if f.startswith("--offload-arch=")]
    assert len(archs) == 11 and "gfx1151" in archs and "gfx942" in archs
    ours = device_flags(";".join(archs))
    assert [f for f in ours if f.startswith("--offload-arch=")] == [f"--offload-arch={a}" for a in archs]
    assert "-fno-gpu-rdc" in ours and "-fno-gpu-rdc" in study

    def defines(flags):
        named = {re.sub(r"^-D|=.*$", "", f).replace("__", "") for f in flags if f.startswith("-D")}
        return named - {"TORCH_EXTENSION_NAME"}

    assert defines(ours) == defines(study)


def test_device_flags_leave_pytorch_rocm_arch_as_it_was(monkeypatch):
    pytest.importorskip("torch")
    from gpulab.toolchains.rocm_extension import device_flags

    monkeypatch.setenv("PYTORCH_ROCM_ARCH", "gfx90a")
    assert "--offload-arch=gfx1151" in device_flags("gfx1151")
    import os

    assert os.environ["PYTORCH_ROCM_ARCH"] == "gfx90a"


def test_hsa_override_runs_the_study_igpu_as_gfx1100():
    """A build without gfx1151 code (Debian's ROCm 5.2 device libraries, older PyTorch wheels) runs on the iGPU
    with HSA_OVERRIDE_GFX_VERSION=11.0.0: the runtime reports gfx1100 and the build targets it."""
    igpu = DeviceInfo(backend="rocm", torch_version="", hip_version="7.1.25424-4179531dcd",
                      cuda_version=None, gpu_available=True, arch="gfx1151", name="AMD Radeon 8060S")
    assert gfx_from_override("11.0.0") == "gfx1100"
    assert offload_archs(igpu, environ={}) == ["gfx1151"]
    assert offload_archs(igpu, environ={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}) == ["gfx1100"]
