from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.core.device import DeviceInfo, detect, gfx_from_override, offload_archs


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
    from gpulab.core.device import gpu_driver_present

    node = tmp_path / "kfd"
    assert not gpu_driver_present((str(node),))
    node.touch()
    assert gpu_driver_present((str(tmp_path / "nvidiactl"), str(node)))


def test_hidden_gpus_make_a_process_measure_the_cpu_and_say_why():
    code = ("from gpulab.core.device import hide_gpus, detect; hide_gpus('the tiny model runs beside'); "
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

    from gpulab.core.device import teardown_profiler_after_use

    monkeypatch.setattr(torch.version, "cuda", cuda)
    environ = {} if preset is None else {"TEARDOWN_CUPTI": preset}
    teardown_profiler_after_use(environ)
    assert environ.get("TEARDOWN_CUPTI") == expected


def _claim_in_subprocess(lock: Path, record: Path, hold_s: float) -> subprocess.Popen:
    code = ("import time; from gpulab.core.device_lock import claim_device; "
            f"print('waited', claim_device({str(lock)!r}), flush=True); time.sleep({hold_s})")
    from gpulab.core import jobenv

    env = dict(os.environ)
    jobenv.put("device_waits", str(record), env)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def test_a_job_waits_for_the_device_until_the_job_holding_it_exits(tmp_path):
    from gpulab.core.device_lock import read_waits, waited_s

    lock = tmp_path / "device.lock"
    first = _claim_in_subprocess(lock, tmp_path / "first.jsonl", hold_s=2.0)
    assert first.stdout is not None and "waited" in first.stdout.readline()  # the first claim: no wait
    second = _claim_in_subprocess(lock, tmp_path / "second.jsonl", hold_s=0.0)
    first.communicate(timeout=60)
    out_second, _ = second.communicate(timeout=60)
    assert second.returncode == 0 and first.returncode == 0
    # the second job's claim returned only once the first job had exited (after its 2 s), and its record says so
    assert waited_s(read_waits(tmp_path / "second.jsonl")) > 1.0, out_second
    assert waited_s(read_waits(tmp_path / "first.jsonl")) < 1.0


def test_claiming_twice_in_one_process_and_without_a_lock_does_not_wait(tmp_path, monkeypatch):
    import gpulab.core.device_lock as device_lock
    from gpulab.core import jobenv

    monkeypatch.setattr(device_lock, "_CLAIM", {"armed": False, "file": None})
    monkeypatch.setattr(os, "environ", dict(os.environ))
    jobenv.put("device_lock", None)
    jobenv.put("device_waits", str(tmp_path / "waits.jsonl"))
    assert device_lock.claim_device() is None  # no lock named: cluster runs, CPU-only machines
    lock = str(tmp_path / "device.lock")
    assert device_lock.child_should_claim()
    assert device_lock.claim_device(lock) is not None
    assert device_lock.claim_device(lock) is None  # held already: re-entrant within the job
    assert not device_lock.child_should_claim()  # a child started now would wait for its own parent
    device_lock._CLAIM["file"].close()
    assert len(device_lock.read_waits(tmp_path / "waits.jsonl")) == 1  # one claim, one record


def test_the_device_wait_is_the_union_of_the_recorded_claims():
    from gpulab.core.device_lock import waited_s

    assert waited_s([{"claimed_at": 100.0, "waited_s": 12.345}]) == pytest.approx(12.345)
    assert waited_s([]) == 0.0
    # two child processes that waited at once (10 s and 14 s, ending 4 s apart) waited 14 s of the job's time,
    # and the job's own claim after them another 1 s
    claims = [{"claimed_at": 10.0, "waited_s": 10}, {"claimed_at": 14.0, "waited_s": 14},
              {"claimed_at": 20.0, "waited_s": 1}]
    assert waited_s(claims) == pytest.approx(15.0)


def test_a_jobs_wait_record_is_fresh_and_its_child_processes_append_to_it(tmp_path, monkeypatch):
    """A job's fresh interpreter (the extension's bad-input cases, the tutorial timings) records its claim in the
    job's record, so the report can tell its wait from the job's work; a rerun of the job starts a new record."""
    from gpulab.core import jobenv
    from gpulab.core.device_lock import read_waits, start_waits_record

    log = tmp_path / "t" / "logs" / "job.log"
    stale = tmp_path / "t" / "device_waits" / "job.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text('{"pid": 1, "claimed_at": 0, "waited_s": 99}\n')
    monkeypatch.setattr(os, "environ", dict(os.environ))
    jobenv.put("device_waits", None)
    assert start_waits_record(log) == stale and not stale.exists()
    code = f"from gpulab.core.device_lock import claim_device; claim_device({str(tmp_path / 'device.lock')!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    (claim,) = read_waits(stale)
    assert claim["waited_s"] < 1.0 and claim["pid"] != os.getpid()


def test_the_device_lock_is_per_user_and_per_visible_devices():
    from gpulab.core.device_lock import device_lock_path

    assert device_lock_path({"CUDA_VISIBLE_DEVICES": "0"}) != device_lock_path({"CUDA_VISIBLE_DEVICES": "1"})
    assert device_lock_path({}) == device_lock_path({})
    assert str(os.getuid()) in Path(device_lock_path({})).name
    assert "/" not in Path(device_lock_path({"CUDA_VISIBLE_DEVICES": "GPU-1/2"})).name


@pytest.mark.parametrize(("resources", "expected"), [({"gpu": 1}, True), ({"gpu": 0}, False), ({}, False)])
def test_only_jobs_holding_the_gpu_resource_claim_the_device(resources, expected):
    from types import SimpleNamespace

    from gpulab.workflow.step import holds_gpu

    assert holds_gpu(SimpleNamespace(resources=SimpleNamespace(**resources))) is expected


def test_a_job_refuses_to_measure_its_target_on_another_machine(tmp_path, monkeypatch):
    """A target's rows carry its env.json's fingerprint: measured on another device they would be labelled as the
    target's machine, so the job stops with what to do instead."""
    import json

    from gpulab.core import device

    env_json = tmp_path / "h100" / "env" / "env.json"
    env_json.parent.mkdir(parents=True)
    env_json.write_text(json.dumps({"device": {"name": "NVIDIA H100 80GB HBM3", "backend": "cuda"}}))
    here = DeviceInfo(backend="cpu", torch_version="2", hip_version=None, cuda_version=None, gpu_available=False,
                      name="AMD EPYC 7B13")
    monkeypatch.setattr(device, "_detect_uncached", lambda: here)
    monkeypatch.setattr(device, "_EXPECTED", {})
    assert device.probe() == here  # no target expected: any device
    device.expect_device(env_json)
    with pytest.raises(device.WrongMachineError, match=r"describes NVIDIA H100 80GB HBM3 \(cuda\), but this job runs "
                       r"on AMD EPYC 7B13 \(cpu\): target 'h100'.*--config target=NAME"):
        device.probe()
    env_json.write_text(json.dumps({"device": {"name": "AMD EPYC 7B13", "backend": "cpu"}}))
    device.expect_device(env_json)
    assert device.probe() == here


ROCM_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rocm"


def test_the_rocm_last_level_cache_is_the_measured_agents_largest_level(monkeypatch):
    """On a host with two kinds of GPU agent (the recorded Radeon 8060S and MI300X blocks), the agent of the
    measured architecture gives its largest cache: the Infinity Cache over the L2; where rocminfo says nothing, the
    runtime's L2."""
    import gpulab.core.device as device

    both = (ROCM_FIXTURES / "rocminfo_gfx1151_agent.txt").read_text() + (
        ROCM_FIXTURES / "rocminfo_mi300x_agent.txt").read_text()
    assert device.rocm_llc_bytes(both, "gfx942") == 256 * 2**20
    assert device.rocm_llc_bytes(both, "gfx1151") == 32 * 2**20
    assert device.rocm_llc_bytes(both, "gfx90a") == 32 * 2**20  # not listed: the first GPU agent
    no_gpu = (Path(__file__).resolve().parent / "fixtures" / "env" / "rocminfo_no_gpu.stdout").read_text()
    assert device.rocm_llc_bytes(no_gpu) == 0
    rocm = DeviceInfo(backend="rocm", torch_version="t", hip_version="7.0", cuda_version=None, gpu_available=True,
                      arch="gfx942", l2_cache_bytes=4 * 2**20)
    monkeypatch.setattr(device, "_rocminfo_text", lambda: both)
    assert device.last_level_cache_bytes(rocm) == 256 * 2**20
    monkeypatch.setattr(device, "_rocminfo_text", lambda: "")
    assert device.last_level_cache_bytes(rocm) == 4 * 2**20
    cuda = DeviceInfo(backend="cuda", torch_version="t", hip_version=None, cuda_version="13.0", gpu_available=True,
                      l2_cache_bytes=60 * 2**20)
    assert device.last_level_cache_bytes(cuda) == 60 * 2**20
