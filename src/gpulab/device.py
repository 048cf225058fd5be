"""The one device/backend detector: ROCm vs CUDA vs CPU, and what the device is.

On ROCm builds of PyTorch ``torch.cuda`` is HIP, so the backend is told apart by
``torch.version.hip`` / ``torch.version.cuda``, never by the ``cuda`` namespace. No other module
re-derives any of this: they call :func:`detect`.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpulab.logs import JOB_LOG_VAR, LOG_FORMAT

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
        reason = os.environ.get(GPUS_HIDDEN_REASON) or reason
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


# Set (with the reason) by hide_gpus; detect() then reports that reason for measuring the CPU.
GPUS_HIDDEN_REASON = "GPULAB_GPUS_HIDDEN"


def hide_gpus(reason: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Make this process measure the CPU on a machine with a GPU; before PyTorch starts. An invalid index hides
    every device from CUDA and HIP alike; ``reason`` is what :func:`detect` reports instead of "no GPU"."""
    environ = os.environ if environ is None else environ
    environ.update({"CUDA_VISIBLE_DEVICES": "-1", "HIP_VISIBLE_DEVICES": "-1", GPUS_HIDDEN_REASON: reason})


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


@functools.cache
def detect() -> DeviceInfo:
    """Detect once per process; every step calls this. In a job that holds the ``gpu`` resource of a local run,
    the first detection of a GPU also claims the device (:func:`claim_device`): the job's device work starts here."""
    info = _detect_uncached()
    if info.gpu_available and _CLAIM["armed"]:
        claim_device()
    return info


def probe() -> DeviceInfo:
    """The device as :func:`detect` sees it, without claiming it: for a build that only needs its architecture,
    so that the compiler runs while another job measures."""
    return _detect_uncached()


# A local run on a machine with a GPU lets three device jobs start at once (common.smk): one measures while the
# others start Python, import PyTorch, transformers or pandas and run their compilers (5-25 s a job on the H100
# host, none of it on the device). This lock keeps their device work one at a time: a job takes it when it first
# detects the GPU and keeps it until it exits. The Snakefile names the file (DEVICE_LOCK_VAR); gpulab.step
# arms the claim in jobs that hold the ``gpu`` resource only, so CPU jobs never wait; a job's child process claims
# only when asked to (``--claim-device``, while its parent does not hold the device: claims_for_helpers).
DEVICE_LOCK_VAR = "GPULAB_DEVICE_LOCK"
_CLAIM: dict[str, object] = {"armed": False, "file": None}
# The line a claim leaves in the job's log; the report reads the waits back (device_wait_s). A job's child process
# (a fresh interpreter it runs for one measurement) writes its line to the job's log too (JOB_LOG_VAR).
CLAIM_MESSAGE = "device claimed after waiting %.2f s for the measurements of another job"
_CLAIM_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"
                         + re.escape(CLAIM_MESSAGE.split("%")[0]) + r"([0-9.]+) s", re.M)


def device_lock_path(environ: Mapping[str, str] | None = None) -> str:
    """The lock of this user's runs on the devices this process sees (one per CUDA/HIP_VISIBLE_DEVICES value):
    two runs on one GPU do not measure at once either, runs pinned to different GPUs do not wait for each other."""
    env = os.environ if environ is None else environ
    visible = "-".join(env.get(name, "all") for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"))
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", visible)
    return os.path.join(tempfile.gettempdir(), f"gpulab-device-{os.getuid()}-{safe}.lock")


def arm_device_claim() -> None:
    """Make this process's first detection of a GPU claim the device (a job holding the ``gpu`` resource)."""
    _CLAIM["armed"] = True


def claim_device(path: str | None = None) -> float | None:
    """Wait until no other job holds the device lock, then hold it until this process exits; returns the seconds
    waited (logged as CLAIM_MESSAGE), or None where there is no lock (cluster runs, CPU-only machines) or this
    process holds it already."""
    path = path or os.environ.get(DEVICE_LOCK_VAR)
    if not path or _CLAIM["file"] is not None:
        return None
    start = time.monotonic()
    handle = open(path, "a")  # noqa: SIM115 - held open, and so locked, as long as the process
    fcntl.flock(handle, fcntl.LOCK_EX)
    _CLAIM["file"] = handle
    waited = time.monotonic() - start
    _log_claim(waited)
    return waited


def claims_for_helpers() -> bool:
    """Whether a child process this one starts should claim the device itself: not while this process holds it
    (the child would wait for its own parent)."""
    return _CLAIM["file"] is None


def _log_claim(waited: float) -> None:
    if logging.getLogger().handlers or not os.environ.get(JOB_LOG_VAR):
        logging.getLogger(__name__).info(CLAIM_MESSAGE, waited)
        return
    # A child process of the job: the job's log line, in the job's format, with the child's pid.
    record = logging.makeLogRecord({"name": f"{__name__} (pid {os.getpid()})", "levelname": "INFO",
                                    "msg": CLAIM_MESSAGE, "args": (waited,)})
    with open(os.environ[JOB_LOG_VAR], "a", encoding="utf-8") as log:
        log.write(logging.Formatter(LOG_FORMAT).format(record) + "\n")


def device_wait_s(log_text: str) -> float:
    """Seconds a job waited for the device, from its log's claim lines: the union of the waits, as a job's child
    processes may wait at once (0 where it never waited: no lock, or no GPU)."""
    spans = []
    for stamp, waited in _CLAIM_LINE.findall(log_text):
        end = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        spans.append((end - float(waited), end))
    total, reach = 0.0, -math.inf
    for begin, end in sorted(spans):
        total += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    return total


def synchronize(device: DeviceInfo | str | None = None) -> None:
    """Wait for the work queued on the device (nothing to wait for on a CPU). ``device`` is the detected
    device, a torch device string ("cpu", "cuda:0"), or None for this process's device."""
    gpu = device != "cpu" if isinstance(device, str) else (device or detect()).gpu_available
    if gpu:
        import torch

        torch.cuda.synchronize()
