"""The one device/backend detector: ROCm vs CUDA vs CPU, and what the device is.

On ROCm builds of PyTorch ``torch.cuda`` is HIP, so the backend is told apart by
``torch.version.hip`` / ``torch.version.cuda``, never by the ``cuda`` namespace. No other module
re-derives any of this: they call :func:`detect`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpulab.core import jobenv
from gpulab.core.device_lock import claim_armed, claim_device

Backend = Literal["rocm", "cuda", "cpu"]

# Debian's hipcc 5.2.3 ships device libraries for these, so a GPU-less build machine targets the first.
DEFAULT_GFX_WITHOUT_GPU = "gfx90a"


@dataclass(frozen=True)
class DeviceInfo:
    backend: Backend
    torch_version: str
    hip_version: str | None
    cuda_version: str | None
    gpu_available: bool
    reason: str = ""  # why no GPU is usable, when gpu_available is False
    name: str = "cpu"
    arch: str | None = None  # gfx90a / gfx1100 / sm_90; None on CPU
    arch_full: str | None = None  # e.g. gfx90a:sramecc+:xnack- as the runtime reports it
    total_memory_bytes: int = 0
    multiprocessor_count: int = 0
    warp_size: int = 0
    l2_cache_bytes: int = 0
    device_count: int = 0
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def torch_device(self) -> str:
        return "cuda" if self.gpu_available else "cpu"

    @property
    def build_backend(self) -> Backend:
        """Backend PyTorch was built for, even when no device is visible (for compiling)."""
        if self.hip_version:
            return "rocm"
        if self.cuda_version:
            return "cuda"
        return "cpu"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["torch_device"] = self.torch_device
        return out


def gfx_from_override(value: str) -> str:
    """Map ``HSA_OVERRIDE_GFX_VERSION`` (``11.0.0``, ``9.0.10``) to the ISA name it makes the runtime report.

    The runtime reads major.minor.stepping and names the ISA gfx<major><minor:x><stepping:x>,
    so 11.0.0 -> gfx1100, 10.3.0 -> gfx1030, 9.0.10 -> gfx90a.
    """
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value)
    if not match:
        raise ValueError(f"HSA_OVERRIDE_GFX_VERSION={value!r} is not of the form MAJOR.MINOR.STEPPING (e.g. 11.0.0)")
    major, minor, step = (int(g) for g in match.groups())
    if minor > 15 or step > 15:
        raise ValueError(f"HSA_OVERRIDE_GFX_VERSION={value!r}: minor and stepping must be < 16")
    return f"gfx{major}{minor:x}{step:x}"


def _short_arch(arch_full: str) -> str:
    return arch_full.split(":", 1)[0]


def offload_archs(
    info: DeviceInfo, pinned: list[str] | None = None, environ: dict[str, str] | None = None
) -> list[str]:
    """GPU architectures to compile for: pinned by config, else the override, else the detected device.

    Only one arch is built by default (the study's build took 94 s for eleven).
    """
    if pinned:
        return list(pinned)
    env = os.environ if environ is None else environ
    if info.build_backend == "rocm" or info.backend == "rocm" or (info.backend == "cpu" and not info.cuda_version):
        override = env.get("HSA_OVERRIDE_GFX_VERSION")
        if override:
            return [gfx_from_override(override)]
        if info.arch and info.arch.startswith("gfx"):
            return [info.arch]
        return [DEFAULT_GFX_WITHOUT_GPU]
    if info.arch and info.arch.startswith("sm_"):
        return [info.arch]
    return []


def _detect_uncached() -> DeviceInfo:
    import torch

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    base: dict[str, Any] = {"torch_version": torch.__version__, "hip_version": hip, "cuda_version": cuda}
    try:
        available = torch.cuda.is_available()
        probe_error = ""
    except Exception as exc:  # a broken driver must become a recorded reason, not a crash
        available, probe_error = False, f"{type(exc).__name__}: {exc}"
    if not available:
        if hip:
            reason = "PyTorch is a ROCm build but no AMD GPU is visible"
        elif cuda:
            reason = "PyTorch is a CUDA build but no NVIDIA GPU is visible"
        else:
            reason = "PyTorch is a CPU-only build"
        reason = jobenv.get("gpus_hidden") or reason
        if probe_error:
            reason += f" ({probe_error})"
        return DeviceInfo(backend="cpu", gpu_available=False, reason=reason, name=cpu_model_name(), **base)

    props = torch.cuda.get_device_properties(0)
    if hip:
        arch_full = getattr(props, "gcnArchName", "") or "unknown"
        arch = _short_arch(arch_full)
    else:
        arch_full = arch = f"sm_{props.major}{props.minor}"
    return DeviceInfo(
        backend="rocm" if hip else "cuda",
        gpu_available=True,
        name=torch.cuda.get_device_name(0),
        arch=arch,
        arch_full=arch_full,
        total_memory_bytes=int(props.total_memory),
        multiprocessor_count=int(props.multi_processor_count),
        warp_size=int(getattr(props, "warp_size", 64 if hip else 32)),
        l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)),
        device_count=torch.cuda.device_count(),
        **base,
    )


def last_level_cache_bytes(info: DeviceInfo) -> int:
    """The largest cache between the device and its memory, in bytes (0 where unknown): a CUDA GPU's L2 as the
    runtime reports it; on ROCm the larger of the L2 and the Infinity Cache (MALL, rocminfo's L3: MI300X's 256 MiB
    dwarfs its 4 MiB L2); a CPU's highest cache level (sysfs)."""
    if info.backend == "cuda":
        return info.l2_cache_bytes
    if info.backend == "rocm":
        return max(info.l2_cache_bytes, rocm_llc_bytes(_rocminfo_text(), info.arch))
    return cpu_llc_bytes()


def rocm_llc_bytes(rocminfo: str, arch: str | None = None) -> int:
    """The largest cache level of the GPU agent named ``arch`` (else the first GPU agent) in ``rocminfo``'s output."""
    from gpulab.core.smi import parse_rocminfo_caches

    agents = parse_rocminfo_caches(rocminfo)
    agent = next((a for a in agents if a["name"] == arch), agents[0] if agents else {})
    return max((v for k, v in agent.items() if k.endswith("_bytes")), default=0)


@functools.cache
def _rocminfo_text() -> str:
    from gpulab.core.tools import run_tool

    result = run_tool("rocminfo", ("rocminfo",), timeout_s=30)
    return result.stdout if result.status == "ok" else ""


CPU_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_llc_bytes(root: Path = CPU_CACHE_SYSFS) -> int:
    """The highest data or unified cache level of CPU 0 (``index*/level``, ``type``, ``size`` as ``32768K``), in
    bytes; 0 where sysfs does not say."""
    best = (0, 0)
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size)
        if kind != "Instruction" and match:
            best = max(best, (level, int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]]))
    return best[1]


def cpu_model_name() -> str:
    """The CPU's model name (also the device name of CPU-only runs)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def hide_gpus(reason: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Make this process measure the CPU on a machine with a GPU; before PyTorch starts. An invalid index hides
    every device from CUDA and HIP alike; ``reason`` is what :func:`detect` reports instead of "no GPU"."""
    environ = os.environ if environ is None else environ
    environ.update({"CUDA_VISIBLE_DEVICES": "-1", "HIP_VISIBLE_DEVICES": "-1"})
    jobenv.put("gpus_hidden", reason, environ)


def teardown_profiler_after_use(environ: MutableMapping[str, str] | None = None) -> None:
    """Have Kineto tear CUPTI down when a profile stops (``TEARDOWN_CUPTI=1``, unless set): left subscribed,
    CUPTI slows every later kernel launch of the process, so steps timed after a profile would time more work.
    Not on CUDA before 12.6, where re-initialising it after a teardown crashes with CUDA graphs (PyTorch turns it
    off there itself); ROCm's tracer is not CUPTI."""
    import torch

    environ = os.environ if environ is None else environ
    cuda = getattr(torch.version, "cuda", None)
    if cuda and tuple(int(p) for p in cuda.split(".")[:2]) >= (12, 6):
        environ.setdefault("TEARDOWN_CUPTI", "1")


def warm_on_side_stream(run: Callable[[], Any], steps: int) -> None:
    """``steps`` calls of ``run`` on a side stream before a device-graph capture (compilation, autotuning and
    library handles happen there, as capturing requires)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(steps):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


# Device nodes of NVIDIA's driver and of AMD's ROCm kernel driver (/dev/kfd).
GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")


def gpu_driver_present(nodes: tuple[str, ...] = GPU_DRIVER_NODES) -> bool:
    """Whether this machine has a GPU driver, judged without starting a runtime (cheap enough for the Snakefile:
    without one, the jobs that measure on the device measure the CPU and must not share it, common.smk)."""
    return any(os.path.exists(node) for node in nodes)


class WrongMachineError(RuntimeError):
    """A job of a target runs on another device than the one the target's environment was captured on."""


# The device of the target a job measures, from its env.json (:func:`expect_device`); empty: anything goes.
_EXPECTED: dict[str, str] = {}


def expect_device(env_json: str | Path) -> None:
    """Make this process's detections refuse a device other than the one ``results/<target>/env/env.json``
    describes: the target's rows carry that environment's fingerprint, so they must be measured on it (a target
    copied in from another machine and run again under its name would otherwise be labelled as that machine)."""
    device = json.loads(Path(env_json).read_text()).get("device") or {}
    if device.get("name") and device.get("backend"):
        _EXPECTED.update(env_json=str(env_json), name=device["name"], backend=device["backend"])


def _checked(info: DeviceInfo) -> DeviceInfo:
    if _EXPECTED and (info.backend, info.name) != (_EXPECTED["backend"], _EXPECTED["name"]):
        env_json = Path(_EXPECTED["env_json"])
        target = env_json.parent.parent.name
        raise WrongMachineError(
            f"{env_json} describes {_EXPECTED['name']} ({_EXPECTED['backend']}), but this job runs on {info.name} "
            f"({info.backend}): target {target!r} is measured on its own machine. Measure this one under its own "
            f"name (--config target=NAME), or delete {env_json} to capture this machine as {target!r} afresh.")
    return info


@functools.cache
def detect() -> DeviceInfo:
    """Detect once per process; every step calls this. In a job that holds the ``gpu`` resource of a local run,
    the first detection of a GPU also claims the device (:mod:`gpulab.core.device_lock`): the job's device work starts
    here. A device other than the one the job's target was captured on (:func:`expect_device`) stops the job."""
    info = _checked(_detect_uncached())
    if info.gpu_available and claim_armed():
        claim_device()
    return info


def probe() -> DeviceInfo:
    """The device as :func:`detect` sees it, without claiming it: for a build that only needs its architecture,
    so that the compiler runs while another job measures."""
    return _checked(_detect_uncached())


def synchronize(device: DeviceInfo | str | None = None) -> None:
    """Wait for the work queued on the device (nothing to wait for on a CPU). ``device`` is the detected
    device, a torch device string ("cpu", "cuda:0"), or None for this process's device."""
    gpu = device != "cpu" if isinstance(device, str) else (device or detect()).gpu_available
    if gpu:
        import torch

        torch.cuda.synchronize()


MiB = 2**20
# The largest fp32 tensor the auto sizes use: 1/16 of a GPU's memory, at most 4 GiB; small on a CPU.
GPU_CAP_BYTES = 4096 * MiB
CPU_CAP_BYTES = 16 * MiB


def max_tensor_bytes(info: DeviceInfo, setting: int | str = "auto") -> int:
    """Largest fp32 tensor of the auto sizes, in bytes (``bench.max_tensor_mib``)."""
    if setting != "auto":
        return int(setting) * MiB
    if not info.gpu_available:
        return CPU_CAP_BYTES
    if not info.total_memory_bytes:
        return 1024 * MiB
    return min(GPU_CAP_BYTES, info.total_memory_bytes // 16)
