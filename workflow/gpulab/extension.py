"""The PyTorch C++/HIP/CUDA extension: build (or load from the cache) the ``torch.ops.gpulab`` operators.

``kernels/ext/`` holds one set of sources: ``ops.cpp`` (operator schemas and CPU kernels) and
``ops_cuda.cu`` (GPU kernels, hipified by PyTorch on ROCm builds). What is built follows the detected
backend (:func:`gpulab.device.detect`): a CPU-only library with the host compiler on machines without a
GPU, otherwise the GPU kernels for the detected architecture only (``TORCH_CUDA_ARCH_LIST`` /
``PYTORCH_ROCM_ARCH``; the study's build compiled for eleven AMD architectures and took 94 s).

The build directory is ``.cache/extensions/<target>/gpulab_ops_<digest>``, where the digest covers the
sources, flags, architectures, backend, compilers and torch version: a rebuild happens exactly when one
of them changes, and a finished build is marked by ``build.json`` so a half-built directory is never
loaded. The compiler's output goes to ``build.log`` in that directory; a failed build returns
``status="failed"`` with the compiler's own error lines as the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpulab.device import DeviceInfo, detect, offload_archs
from gpulab.env_capture import run_tool
from gpulab.paths import KERNELS_DIR, REPO_ROOT
from gpulab.tables import Column, TableSchema, write_atomic

SOURCE_DIR = KERNELS_DIR / "ext"
CPU_SOURCES = ("ops.cpp",)
GPU_SOURCES = ("ops_cuda.cu",)
HEADERS = ("ops_common.h",)
DEFAULT_EXTRA_CFLAGS = ("-O3",)
CACHE_ENV = "GPULAB_CACHE_DIR"  # overrides the workflow's cache (tests, read-only checkouts)
OP_NAMES = ("vector_add", "gelu_tanh", "softmax_rows")
# Written by the extension step so that a later `load_ops(target)` (the benchmarks) loads that build.
SELECTION_FILE = "selected.json"
MARKER_FILE = "build.json"
LOG_FILE = "build.log"


def default_cache_root() -> Path:
    """The workflow's own cache, ``.cache/`` in the checkout (git-ignored), unless $GPULAB_CACHE_DIR says."""
    return Path(os.environ.get(CACHE_ENV) or REPO_ROOT / ".cache")


class ExtensionBuildError(RuntimeError):
    """The extension failed to compile; the message carries the compiler's error lines."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines the built library; its digest names the build directory."""

    backend: str  # cpu | cuda | rocm: what the library is built for
    archs: tuple[str, ...]
    source_dir: Path
    sources: tuple[str, ...]
    headers: tuple[str, ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    arch_env: tuple[tuple[str, str], ...]  # (TORCH_CUDA_ARCH_LIST | PYTORCH_ROCM_ARCH, value)
    host_compiler: str
    host_compiler_version: str
    device_compiler: str | None
    device_compiler_version: str | None
    torch_version: str
    digest: str = ""  # fixed when planned: content of the sources then, plus every field above

    def content_digest(self, source_dir: Path | None = None) -> str:
        h = hashlib.sha256()
        for name in (*self.sources, *self.headers):
            h.update(name.encode() + b"\0" + ((source_dir or self.source_dir) / name).read_bytes() + b"\0")
        meta = asdict(self)
        for key in ("source_dir", "digest"):  # the content matters, not where the checkout lives
            meta.pop(key)
        h.update(json.dumps(meta, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"gpulab_ops_{self.digest}"

    @property
    def compiler(self) -> str:
        """The compiler of the kernels: the device compiler on GPU builds, else the host compiler."""
        if self.device_compiler:
            return f"{Path(self.device_compiler).name} {self.device_compiler_version or ''}".strip()
        return f"{Path(self.host_compiler).name} {self.host_compiler_version}".strip()

    @property
    def flags(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.arch_env)
        cflags = " ".join(self.extra_cflags)
        cuda = " ".join(self.extra_cuda_cflags) if self.backend != "cpu" else ""
        return " ".join(p for p in (env, f"cflags: {cflags}", f"device cflags: {cuda}" if cuda else "") if p)


@dataclass(frozen=True)
class ExtensionLoad:
    """Outcome of :func:`load_ops`: whether the operators are usable here, and how they were obtained."""

    status: str  # ok | skipped | failed
    reason: str
    target: str
    backend: str = ""
    archs: tuple[str, ...] = ()
    compiler: str = ""
    host_compiler: str = ""
    flags: str = ""
    name: str = ""
    build_dir: str = ""
    library: str = ""
    log_path: str = ""
    cached: bool = False  # loaded an existing build (no compiler ran)
    seconds: float = float("nan")  # wall time of this call: the build (cold) or the load (warm)
    build_s: float = float("nan")  # the cold build's wall time (measured now, or recorded when it ran)
    built_at: str = ""
    compiler_output: str = field(default="", repr=False)  # the compiler's error lines on failure

    @property
    def arch(self) -> str:
        return ",".join(self.archs) if self.archs else "cpu"

    @property
    def ops(self) -> Any:
        """``torch.ops.gpulab`` (raises when the build is not usable)."""
        self.raise_for_status()
        import torch

        return torch.ops.gpulab

    def raise_for_status(self) -> None:
        if self.status == "failed":
            raise ExtensionBuildError(f"building the gpulab extension failed: {self.reason}\n{self.compiler_output}")
        if self.status != "ok":
            raise RuntimeError(f"the gpulab extension is not available here: {self.reason}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["archs"] = list(self.archs)
        return out


# ------------------------------------------------------------------------------------------- planning


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def compiler_version(path: str) -> str:
    """One identifying line of ``<compiler> --version`` (nvcc: the release line; hipcc: the HIP line)."""
    result = run_tool(Path(path).name, [path, "--version"], timeout_s=60, env={"HIP_PLATFORM": "amd"}
                      if Path(path).name.startswith("hipcc") else None)
    text = result.stdout or result.stderr
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    key = {"nvcc": "release", "hipcc": "HIP version"}.get(Path(path).name)
    hit = next((ln for ln in lines if key and key in ln), None)
    return hit or (lines[0] if lines else f"version unknown ({result.reason or 'no output'})")


def _device_compiler(backend: str) -> tuple[str | None, str]:
    """Path of nvcc/hipcc that torch's extension builder will use, or (None, why not)."""
    from torch.utils import cpp_extension

    if backend == "cuda":
        home = cpp_extension.CUDA_HOME
        exe = Path(home, "bin", "nvcc") if home else None
        if exe is None or not exe.exists():
            return None, f"nvcc not found (CUDA_HOME={home or 'unset'}); install the CUDA toolkit matching torch"
        return str(exe), ""
    home = cpp_extension.ROCM_HOME
    exe = Path(home, "bin", "hipcc") if home else None
    if exe is None or not exe.exists():
        return None, f"hipcc not found (ROCM_HOME={home or 'unset'}); install ROCm's hipcc"
    return str(exe), ""


def _pinned_for(backend: str, pinned: Sequence[str] | None) -> list[str]:
    """Pinned archs that apply to this backend (one config may pin for AMD and NVIDIA targets alike)."""
    prefix = "gfx" if backend == "rocm" else "sm_"
    return [a for a in (pinned or []) if a.startswith(prefix)]


def arch_environment(backend: str, archs: Sequence[str]) -> dict[str, str]:
    """The variable torch's builder reads to choose GPU architectures, set to exactly ``archs``."""
    if backend == "cuda":
        # sm_90 -> 9.0, sm_90a -> 9.0a, sm_120 -> 12.0
        values = []
        for arch in archs:
            match = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
            if not match:
                raise ValueError(f"cannot turn {arch!r} into a TORCH_CUDA_ARCH_LIST entry")
            values.append(f"{match.group(1)}.{match.group(2)}{match.group(3)}")
        return {"TORCH_CUDA_ARCH_LIST": ";".join(values)}
    if backend == "rocm":
        return {"PYTORCH_ROCM_ARCH": ";".join(archs)}
    return {}


def plan_build(
    device: DeviceInfo | None = None,
    pinned_archs: Sequence[str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    source_dir: Path = SOURCE_DIR,
    environ: Mapping[str, str] | None = None,
) -> tuple[BuildSpec | None, str]:
    """What to build on this machine, or (None, why nothing can be built)."""
    import torch

    info = device or detect()
    env = os.environ if environ is None else environ
    flags = tuple(DEFAULT_EXTRA_CFLAGS if extra_cflags is None else extra_cflags)
    missing = [n for n in (*CPU_SOURCES, *HEADERS) if not (source_dir / n).is_file()]
    backend = info.backend if info.gpu_available else "cpu"
    if backend != "cpu":
        missing += [n for n in GPU_SOURCES if not (source_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"extension sources missing in {source_dir}: {', '.join(missing)}")

    host = env.get("CXX", "c++")
    host_path = shutil.which(host, path=env.get("PATH"))
    if host_path is None:
        return None, f"no host C++ compiler: {host!r} (CXX or c++) not found on PATH"
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return None, "ninja not found (torch.utils.cpp_extension needs it): pip install ninja"

    archs: list[str] = []
    device_compiler = device_version = None
    if backend != "cpu":
        device_compiler, why = _device_compiler(backend)
        if device_compiler is None:
            return None, why
        device_version = compiler_version(device_compiler)
        archs = _pinned_for(backend, pinned_archs) or offload_archs(info, None, dict(env))
        if not archs:
            return None, f"no GPU architecture detected for backend {backend}"
    spec = BuildSpec(
        backend=backend,
        archs=tuple(archs),
        source_dir=source_dir,
        sources=CPU_SOURCES + (GPU_SOURCES if backend != "cpu" else ()),
        headers=HEADERS,
        extra_cflags=flags,
        extra_cuda_cflags=flags if backend != "cpu" else (),
        arch_env=tuple(sorted(arch_environment(backend, archs).items())),
        host_compiler=host_path,
        host_compiler_version=compiler_version(host_path),
        device_compiler=device_compiler,
        device_compiler_version=device_version,
        torch_version=torch.__version__,
    )
    return replace(spec, digest=spec.content_digest()), ""


def extension_build_dir(target: str, spec: BuildSpec | None = None, cache_root: Path | None = None) -> Path:
    """``.cache/extensions/<target>/<name>``: one directory per distinct (sources, flags, toolchain)."""
    if spec is None:
        spec, why = plan_build()
        if spec is None:
            raise RuntimeError(f"no extension can be built here: {why}")
    return Path(cache_root or default_cache_root()) / "extensions" / target / spec.name


# -------------------------------------------------------------------------------------------- loading

_LOADED: dict[str, ExtensionLoad] = {}  # library name -> outcome, for this process
_FAKES_REGISTERED = False


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (file descriptors too: ninja and the compilers) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    old_streams = sys.stdout, sys.stderr
    with open(path, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            yield
        finally:
            log.flush()
            sys.stdout, sys.stderr = old_streams
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


ERROR_LINE = re.compile(r"(\berror\b|\bError\b|undefined reference|fatal)", re.IGNORECASE)


def compiler_errors(log_text: str, limit: int = 40) -> str:
    """The compiler's own error lines (with the line after each, where the caret usually is)."""
    lines = log_text.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if ERROR_LINE.search(line) and not line.startswith(("ninja: build stopped", "FAILED:")):
            picked.extend(lines[i:i + 3])
        if len(picked) >= limit:
            break
    text = "\n".join(dict.fromkeys(picked))  # keep order, drop repeats
    return text or "\n".join(lines[-limit:])


def register_fakes() -> None:
    """Shape functions for torch.compile / FakeTensor tracing (the C++ side registers no Meta kernels)."""
    global _FAKES_REGISTERED
    if _FAKES_REGISTERED:
        return
    import torch

    @torch.library.register_fake("gpulab::vector_add")
    def _vector_add_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        torch._check(a.shape == b.shape, lambda: f"gpulab::vector_add: shapes {a.shape} and {b.shape} differ")
        torch._check(a.dtype == b.dtype, lambda: f"gpulab::vector_add: dtypes {a.dtype} and {b.dtype} differ")
        return torch.empty_like(a)

    @torch.library.register_fake("gpulab::gelu_tanh")
    def _gelu_tanh_fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.register_fake("gpulab::softmax_rows")
    def _softmax_rows_fake(x: torch.Tensor) -> torch.Tensor:
        torch._check(x.dim() == 2, lambda: f"gpulab::softmax_rows: x must be 2-D, got {x.dim()}-D")
        return torch.empty_like(x)

    _FAKES_REGISTERED = True


def _saved_selection(target: str, cache_root: Path) -> dict[str, Any]:
    path = cache_root / "extensions" / target / SELECTION_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def save_selection(target: str, pinned_archs: Sequence[str] | None, extra_cflags: Sequence[str] | None,
                   cache_root: Path | None = None) -> None:
    """Remember the extension step's build settings for ``target`` so plain ``load_ops(target)`` matches."""
    root = Path(cache_root or default_cache_root())
    write_atomic(root / "extensions" / target / SELECTION_FILE,
                 json.dumps({"pinned_archs": list(pinned_archs or []),
                             "extra_cflags": list(DEFAULT_EXTRA_CFLAGS if extra_cflags is None else extra_cflags)},
                            indent=2) + "\n")


def load_ops(
    target: str,
    *,
    pinned_archs: Sequence[str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    device: DeviceInfo | None = None,
    cache_root: Path | None = None,
    source_dir: Path = SOURCE_DIR,
) -> ExtensionLoad:
    """Build, or load the cached build of, the gpulab operators for this machine's backend.

    With neither ``pinned_archs`` nor ``extra_cflags`` given, the settings the extension step last used
    for ``target`` apply (so the benchmarks load exactly what that step built), else the defaults.
    Never raises for a failed compile or a missing toolchain: see ``status`` / ``reason``.
    """
    call_start = time.perf_counter()
    root = Path(cache_root or default_cache_root())
    if pinned_archs is None and extra_cflags is None:
        saved = _saved_selection(target, root)
        pinned_archs, extra_cflags = saved.get("pinned_archs"), saved.get("extra_cflags")
    spec, why = plan_build(device, pinned_archs, extra_cflags, source_dir)
    if spec is None:
        return ExtensionLoad("skipped", why, target)
    name = spec.name
    build_dir = extension_build_dir(target, spec, root)
    base = ExtensionLoad("ok", "", target, backend=spec.backend, archs=spec.archs, compiler=spec.compiler,
                         host_compiler=f"{Path(spec.host_compiler).name} {spec.host_compiler_version}",
                         flags=spec.flags, name=name, build_dir=str(build_dir),
                         library=str(build_dir / f"{name}.so"), log_path=str(build_dir / LOG_FILE))

    if name in _LOADED:  # already in this process: nothing to build or load
        return replace(_LOADED[name], target=target, cached=True, seconds=time.perf_counter() - call_start)
    if _LOADED:
        other = next(iter(_LOADED))
        return replace(base, status="failed", reason=f"another build of the gpulab operators ({other}) is "
                       "already loaded in this process; one process can hold only one")

    import torch

    marker = build_dir / MARKER_FILE
    library = build_dir / f"{name}.so"
    if marker.is_file() and library.is_file():
        torch.ops.load_library(str(library))
        register_fakes()
        # The whole call, planning included (hashing sources, asking compilers their versions).
        seconds = time.perf_counter() - call_start
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        result = replace(base, cached=True, seconds=seconds, build_s=float(recorded.get("build_s", float("nan"))),
                         built_at=recorded.get("built_at", ""))
        _LOADED[name] = result
        return result
    return _build(spec, base, build_dir)


def _build(spec: BuildSpec, base: ExtensionLoad, build_dir: Path) -> ExtensionLoad:
    import torch
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    # The sources are copied next to the build: hipify writes its output beside its input, and the
    # library is built from exactly the bytes that were hashed.
    src = build_dir / "src"
    src.mkdir(exist_ok=True)
    for name in (*spec.sources, *spec.headers):
        shutil.copy2(spec.source_dir / name, src / name)
    if spec.content_digest(src) != spec.digest:
        return replace(base, status="failed", reason=f"the sources in {spec.source_dir} changed while planning the "
                       "build; run again")
    log_path = build_dir / LOG_FILE
    started = dt.datetime.now(dt.timezone.utc)
    log_path.write_text(f"# gpulab extension {spec.name}: {spec.backend} build for {','.join(spec.archs) or 'cpu'}\n"
                        f"# {spec.flags}\n# started {started.isoformat(timespec='seconds')}\n", encoding="utf-8")
    start = time.perf_counter()
    try:
        with _environment(dict(spec.arch_env)), _output_to(log_path):
            cpp_extension.load(
                name=spec.name,
                sources=[str(src / n) for n in spec.sources],
                extra_cflags=list(spec.extra_cflags),
                extra_cuda_cflags=list(spec.extra_cuda_cflags),
                build_directory=str(build_dir),
                with_cuda=spec.backend != "cpu",
                is_python_module=False,
                verbose=True,
            )
    except Exception as exc:  # a compile error is a recorded outcome carrying the compiler's message
        seconds = time.perf_counter() - start
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        errors = compiler_errors(log_text + "\n" + str(exc))
        first = next((ln for ln in errors.splitlines() if ERROR_LINE.search(ln)), str(exc)).strip()
        return replace(base, status="failed", reason=f"compile error: {first[:400]}", seconds=seconds,
                       compiler_output=errors)
    seconds = time.perf_counter() - start
    register_fakes()
    built_at = started.isoformat(timespec="seconds")
    write_atomic(build_dir / MARKER_FILE, json.dumps(
        {"name": spec.name, "build_s": seconds, "built_at": built_at, "backend": spec.backend,
         "archs": list(spec.archs), "compiler": spec.compiler, "flags": spec.flags,
         "torch": torch.__version__}, indent=2) + "\n")
    result = replace(base, cached=False, seconds=seconds, build_s=seconds, built_at=built_at)
    _LOADED[spec.name] = result
    return result


# ---------------------------------------------------------------------------------- the workflow step

EXTENSION = TableSchema(
    "extension",
    (
        Column("phase", "str",
               "cold_build (compiler ran, or the recorded cold build) | warm_load (fresh process, cache hit)"),
        Column("backend", "str", "cpu | cuda | rocm: what the library was built for"),
        Column("arch", "str", "GPU architectures compiled (sm_90, gfx90a), or cpu"),
        Column("compiler", "str", "compiler of the kernels and its version"),
        Column("host_compiler", "str", "host C++ compiler and its version"),
        Column("flags", "str", "architecture variable and compiler flags"),
        Column("name", "str", "library name (digest of sources, flags and toolchain)"),
        Column("seconds", "float", "wall time of the phase"),
        Column("cached", "bool", "the phase found a finished build and ran no compiler"),
        Column("measured_at", "str", "when the phase's seconds were measured (UTC)"),
        Column("build_dir", "str", "build directory under the workflow's cache"),
    ),
)


def extension_rows(cold: ExtensionLoad, warm: ExtensionLoad | None, *, target: str, fingerprint: str,
                   now: str) -> list[dict[str, Any]]:
    base = {"target": target, "fingerprint": fingerprint}

    def row(load: ExtensionLoad, phase: str, seconds: float, cached: bool, measured_at: str) -> dict[str, Any]:
        return {**base, "status": load.status, "reason": load.reason, "phase": phase, "backend": load.backend,
                "arch": load.arch if load.status != "skipped" else "", "compiler": load.compiler,
                "host_compiler": load.host_compiler, "flags": load.flags, "name": load.name,
                "seconds": seconds, "cached": cached, "measured_at": measured_at, "build_dir": load.build_dir}

    rows = [row(cold, "cold_build", cold.build_s, cold.cached, cold.built_at or now)]
    if warm is not None:
        rows.append(row(warm, "warm_load", warm.seconds, warm.cached, now))
    return rows


def warm_load_in_subprocess(target: str, cache_root: Path | None = None, timeout_s: float = 600) -> ExtensionLoad:
    """Load the cached build in a fresh interpreter, as a later step would; a rebuild there is a failure."""
    argv = [sys.executable, "-m", "gpulab.extension", "--target", target, "--json"]
    if cache_root is not None:
        argv += ["--cache-root", str(cache_root)]
    result = run_tool("python:gpulab.extension", argv, timeout_s=timeout_s)
    if result.status != "ok":
        return ExtensionLoad("failed", f"warm load in a fresh process failed: {result.reason}\n{result.stderr[-2000:]}",
                             target)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    data["archs"] = tuple(data["archs"])
    load = ExtensionLoad(**data)
    if load.status == "ok" and not load.cached:
        return replace(load, status="failed", reason="the warm load rebuilt the extension: the cache missed")
    return load


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or load the gpulab extension; print the outcome.")
    parser.add_argument("--target", default="local")
    parser.add_argument("--cache-root", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print the outcome as one JSON line")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (imported first: its import time is not the extension's load time)

    load = load_ops(args.target, cache_root=args.cache_root)
    if args.json:
        print(json.dumps(load.as_dict(), default=str))
    else:
        print(f"{load.status}: {load.name or '-'} ({load.backend or '-'}, {load.arch}) "
              f"{'cached' if load.cached else 'built'} in {load.seconds:.2f} s {load.reason}")
        if load.compiler_output:
            print(load.compiler_output, file=sys.stderr)
    return 0 if load.status != "failed" else 1


if __name__ == "__main__":
    raise SystemExit(main())


# ------------------------------------------------------------------------------------- correctness

EXTENSION_CHECKS = TableSchema(
    "extension_checks",
    (
        Column("op", "str", "vector_add | gelu_tanh | softmax_rows"),
        Column("dtype", "str", "fp32 | fp16 | bf16"),
        Column("shape", "str", "input shape"),
        Column("layout", "str", "aligned | offset (a view 1 element into its storage: not 16-byte aligned)"),
        Column("device", "str", "where the operator ran (cuda is HIP on ROCm)"),
        Column("max_abs_err", "float", "largest |out - ref|, ref computed in float64 from the same inputs"),
        Column("rel_err", "float", "||out - ref|| / ||ref||"),
        Column("max_abs_diff_native", "float", "largest |out - PyTorch's own op| on the same inputs"),
        Column("unwritten", "int", "output elements still holding the poison (NaN) or otherwise non-finite"),
        Column("rtol", "float", "elementwise tolerance: |out - ref| <= atol + rtol |ref|"),
        Column("atol", "float", "elementwise tolerance"),
    ),
)

# (rtol, atol) per dtype: fp32 arithmetic, then rounding to the output dtype (2^-11 fp16, 2^-8 bf16).
TOLERANCES = {"fp32": (1e-5, 1e-5), "fp16": (1e-3, 1e-5), "bf16": (8e-3, 1e-5)}
SOFTMAX_ATOL = 1e-7  # softmax outputs are tiny for long rows: an absolute slack would hide errors


def check_shapes(on_gpu: bool) -> dict[str, list[tuple[int, ...]]]:
    """Sizes that are not multiples of any block or vector width, tails included, plus a few round ones."""
    elementwise = [(1,), (3,), (7,), (8,), (1023,), (1025,), (4097,), (98433,), (1 << 20,), ((1 << 20) + 5,)]
    softmax = [(1, 1), (3, 7), (5, 33), (7, 256), (4, 1000), (16, 1024), (3, 1500), (2, 4097), (4, 16384),
               (2, 20000), (2, 40000), (1, 100003)]
    if on_gpu:
        elementwise += [(3 * (1 << 22) + 7,)]
        softmax += [(129, 8), (1000, 256), (257, 1024), (33, 16384), (3, 65536)]
    return {"vector_add": elementwise, "gelu_tanh": elementwise, "softmax_rows": softmax}


def _reference(op: str, inputs: Sequence[Any]) -> Any:
    import math

    import torch

    x = [t.double() for t in inputs]
    if op == "vector_add":
        return x[0] + x[1]
    if op == "gelu_tanh":
        v = x[0]
        return 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    return torch.softmax(x[0], dim=-1)


def _native(op: str, inputs: Sequence[Any]) -> Any:
    import torch

    if op == "vector_add":
        return inputs[0] + inputs[1]
    if op == "gelu_tanh":
        return torch.nn.functional.gelu(inputs[0], approximate="tanh")
    return torch.softmax(inputs[0], dim=-1)


def check_ops(target: str, fingerprint: str, device: DeviceInfo | None = None,
              dtypes: Sequence[str] = ("fp32", "fp16", "bf16"), seed: int = 0) -> list[dict[str, Any]]:
    """Each operator against a float64 reference on fresh random inputs, outputs poisoned beforehand."""
    import torch

    from gpulab.dtypes import torch_dtype

    info = device or detect()
    dev = info.torch_device
    ops = torch.ops.gpulab
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for op, shapes in check_shapes(info.gpu_available).items():
        fn = getattr(ops, op)
        arity = 2 if op == "vector_add" else 1
        for dtype in dtypes:
            tdtype = torch_dtype(dtype)
            rtol, atol = TOLERANCES[dtype]
            if op == "softmax_rows":
                atol = SOFTMAX_ATOL
            for shape in shapes:
                for layout in ("aligned", "offset"):
                    numel = math_prod(shape)
                    # Fresh inputs every case; scaled so softmax rows have a real spread and GeLU sees both tails.
                    storage = [(torch.randn(numel + 1, generator=gen) * 3).to(tdtype).to(dev) for _ in range(arity)]
                    start = 1 if layout == "offset" else 0
                    inputs = [s[start:start + numel].view(shape) for s in storage]
                    # The caching allocator hands the freed NaN block to the operator's output.
                    poison = torch.full(shape, float("nan"), dtype=tdtype, device=dev)
                    del poison
                    out = fn(*inputs)
                    if info.gpu_available:
                        torch.cuda.synchronize()
                    ref = _reference(op, inputs)
                    native = _native(op, inputs)
                    out64 = out.double()
                    err = (out64 - ref).abs()
                    unwritten = int((~torch.isfinite(out64)).sum())
                    within = bool((err <= atol + rtol * ref.abs()).all()) and unwritten == 0
                    norm = float(ref.norm())
                    rows.append({
                        "target": target, "fingerprint": fingerprint,
                        "status": "ok" if within and out.shape == ref.shape and out.dtype == tdtype else "incorrect",
                        "reason": "" if within else f"|out - ref| exceeds {atol:g} + {rtol:g}|ref|"
                        + (f"; {unwritten} non-finite outputs" if unwritten else ""),
                        "op": op, "dtype": dtype, "shape": "x".join(map(str, shape)), "layout": layout,
                        "device": dev, "max_abs_err": float(err.max()) if numel else 0.0,
                        "rel_err": float((out64 - ref).norm()) / norm if norm else 0.0,
                        "max_abs_diff_native": float((out64 - native.double()).abs().max()) if numel else 0.0,
                        "unwritten": unwritten, "rtol": rtol, "atol": atol,
                    })
    return rows


def math_prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def run_extension_step(
    target: str, fingerprint: str, build_config: Mapping[str, Any], *, out_csv: Path, checks_csv: Path,
    build_log: Path, cache_root: Path | None = None, device: DeviceInfo | None = None,
    source_dir: Path = SOURCE_DIR,
) -> ExtensionLoad:
    """The extension_build rule: cold build (or the cached one), warm load in a fresh process, checks.

    A compile error raises :class:`ExtensionBuildError` after printing the compiler's output, so the step
    fails with the compiler's message in its log.
    """
    pinned = list(build_config.get("offload_archs") or []) or None
    flags = list(build_config.get("extra_cflags", DEFAULT_EXTRA_CFLAGS))
    save_selection(target, pinned, flags, cache_root)
    cold = load_ops(target, pinned_archs=pinned, extra_cflags=flags, cache_root=cache_root, device=device,
                    source_dir=source_dir)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if cold.status == "failed":
        print(f"gpulab extension build FAILED ({cold.reason}); compiler output:\n{cold.compiler_output}\n"
              f"full build log: {cold.log_path}", file=sys.stderr)
        if cold.log_path and Path(cold.log_path).is_file():
            print(Path(cold.log_path).read_text(encoding="utf-8", errors="replace"), file=sys.stderr)
        raise ExtensionBuildError(f"{cold.reason}\n{cold.compiler_output}")
    print(f"extension {cold.name}: {cold.backend} ({cold.arch}) "
          f"{'cached, built ' + cold.built_at if cold.cached else 'built'} in {cold.build_s:.2f} s")
    base = {"target": target, "fingerprint": fingerprint}
    if cold.status == "skipped":
        write_atomic(build_log, f"# no extension build on this machine: {cold.reason}\n")
        EXTENSION.write(extension_rows(cold, cold, target=target, fingerprint=fingerprint, now=now), out_csv)
        EXTENSION_CHECKS.write([{**base, "status": "skipped", "reason": cold.reason}], checks_csv)
        return cold
    warm = warm_load_in_subprocess(target, cache_root)
    print(f"warm load in a fresh process: {warm.status} in {warm.seconds:.3f} s {warm.reason}")
    shutil.copyfile(cold.log_path, build_log)
    checks = check_ops(target, fingerprint, device)
    bad = [r for r in checks if r["status"] != "ok"]
    print(f"checks: {len(checks) - len(bad)}/{len(checks)} within tolerance")
    for r in bad:
        print(f"  INCORRECT {r['op']} {r['dtype']} {r['shape']} {r['layout']}: {r['reason']} "
              f"(max abs err {r['max_abs_err']:.3g})")
    EXTENSION_CHECKS.write(checks, checks_csv)
    EXTENSION.write(extension_rows(cold, warm, target=target, fingerprint=fingerprint, now=now), out_csv)
    return cold
