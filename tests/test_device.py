from __future__ import annotations

import pytest
from gpulab.device import DeviceInfo, detect, gfx_from_override, offload_archs


@pytest.mark.parametrize(
    ("value", "expected"),
    [("11.0.0", "gfx1100"), ("10.3.0", "gfx1030"), ("9.0.10", "gfx90a"), ("9.4.2", "gfx942"), ("11.5.1", "gfx1151")],
)
def test_gfx_from_override(value, expected):
    assert gfx_from_override(value) == expected


@pytest.mark.parametrize("bad", ["11", "gfx1100", "11.0", "11.0.x", "9.0.16"])
def test_bad_override_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="HSA_OVERRIDE_GFX_VERSION"):
        gfx_from_override(bad)


def _info(**kw):
    base = dict(backend="cpu", torch_version="2.x", hip_version=None, cuda_version=None, gpu_available=False)
    base.update(kw)
    return DeviceInfo(**base)


def test_offload_arch_rocm_device_and_override():
    rocm = _info(backend="rocm", hip_version="7.1", gpu_available=True, arch="gfx1103", arch_full="gfx1103")
    assert offload_archs(rocm, environ={}) == ["gfx1103"]
    # An RDNA3 iGPU run with the override executes gfx1100 code objects, so build for gfx1100.
    assert offload_archs(rocm, environ={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}) == ["gfx1100"]
    assert offload_archs(rocm, pinned=["gfx90a", "gfx942"], environ={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}) == [
        "gfx90a",
        "gfx942",
    ]


def test_offload_arch_without_gpu_defaults_to_debian_hipcc_arch():
    assert offload_archs(_info(), environ={}) == ["gfx90a"]
    assert offload_archs(_info(hip_version="7.1"), environ={}) == ["gfx90a"]


def test_offload_arch_cuda():
    cuda = _info(backend="cuda", cuda_version="13.0", gpu_available=True, arch="sm_90", arch_full="sm_90")
    assert offload_archs(cuda, environ={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}) == ["sm_90"]


def test_detect_on_this_machine_is_consistent():
    info = detect()
    assert info.backend in {"rocm", "cuda", "cpu"}
    if not info.gpu_available:
        assert info.backend == "cpu" and info.reason and info.torch_device == "cpu"
    else:
        assert info.arch and info.total_memory_bytes > 0


def test_a_gpu_driver_is_told_by_its_device_nodes(tmp_path):
    from gpulab.device import gpu_driver_present

    node = tmp_path / "kfd"
    assert not gpu_driver_present((str(node),))
    node.touch()
    assert gpu_driver_present((str(tmp_path / "nvidiactl"), str(node)))


def test_hidden_gpus_make_a_process_measure_the_cpu_and_say_why():
    import os
    import subprocess
    import sys

    code = ("from gpulab.device import hide_gpus, detect; hide_gpus('the tiny model runs beside'); "
            "import os, torch; i = detect(); "
            "print(i.gpu_available, torch.cuda.is_available(), os.environ['CUDA_VISIBLE_DEVICES'], "
            "os.environ['HIP_VISIBLE_DEVICES'], i.reason, sep='|')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"}).stdout.strip()
    assert out == "False|False|-1|-1|the tiny model runs beside"


@pytest.mark.parametrize(("cuda", "preset", "expected"), [
    ("13.0", None, "1"), ("12.6", None, "1"), ("12.4", None, None), (None, None, None), ("13.0", "0", "0")])
def test_cupti_is_torn_down_after_a_profile_where_that_is_safe(monkeypatch, cuda, preset, expected):
    import torch
    from gpulab.device import teardown_profiler_after_use

    monkeypatch.setattr(torch.version, "cuda", cuda)
    environ = {} if preset is None else {"TEARDOWN_CUPTI": preset}
    teardown_profiler_after_use(environ)
    assert environ.get("TEARDOWN_CUPTI") == expected
