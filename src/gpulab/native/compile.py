"""Build the planned extension with torch's extension builder, or find the finished build, and load it.

A finished build is marked by ``build.json`` in its directory, so a half-built directory is never
loaded. The compiler's output goes to ``build.log`` there; a failed build is ``status="failed"`` with the
compiler's own error lines as the reason. Loading is :func:`load_library`: one process holds one build.
"""

from __future__ import annotations

import contextlib
import datetime as dt
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

from gpulab.core.device import DeviceInfo
from gpulab.core.tables import write_atomic
from gpulab.core.tools import run_tool
from gpulab.native.plan import SOURCE_DIR, BuildSpec, plan_build

MARKER_FILE = "build.json"
LOG_FILE = "build.log"
ERROR_LINE = re.compile(r"(\berror\b|\bError\b|undefined reference|fatal)", re.IGNORECASE)


class ExtensionBuildError(RuntimeError):
    """The extension failed to compile; the message carries the compiler's error lines."""


@dataclass(frozen=True)
class ExtensionLoad:
    """Whether the operators are usable here, and how they were obtained (built, found, loaded)."""

    status: str  # ok | skipped | failed
    reason: str
    target: str
    backend: str = ""
    archs: tuple[str, ...] = ()
    compiler: str = ""
    host_compiler: str = ""
    flags: str = ""
    name: str = ""
    digest: str = ""
    build_dir: str = ""
    library: str = ""
    log_path: str = ""
    torch_version: str = ""
    cached: bool = False  # an existing build was used (no compiler ran)
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
            raise ExtensionBuildError(f"the gpulab extension is not usable: {self.reason}\n{self.compiler_output}")
        if self.status != "ok":
            raise RuntimeError(f"the gpulab extension is not available here: {self.reason}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["archs"] = list(self.archs)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExtensionLoad:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "archs": tuple(known.get("archs") or ())})


_LOADED: dict[str, ExtensionLoad] = {}  # library path -> outcome, for this process
_FAKES_REGISTERED = False


def loaded() -> ExtensionLoad | None:
    """The build this process has loaded, if any."""
    return next(iter(_LOADED.values()), None)


def load_library(outcome: ExtensionLoad) -> ExtensionLoad:
    """Load ``outcome.library`` into this process (once); a second, different build is refused."""
    if outcome.library in _LOADED:
        return _LOADED[outcome.library]
    if _LOADED:
        other = next(iter(_LOADED))
        return replace(outcome, status="failed", reason=f"another build of the gpulab operators ({other}) is "
                       "already loaded in this process; one process can hold only one")
    import torch

    start = time.perf_counter()
    torch.ops.load_library(outcome.library)
    register_fakes()
    result = replace(outcome, seconds=time.perf_counter() - start)
    _LOADED[outcome.library] = result
    return result


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
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


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


def compiler_errors(log_text: str, limit: int = 40) -> str:
    """The compiler's own error lines (with the lines after each, where the caret usually is)."""
    lines = log_text.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if ERROR_LINE.search(line) and not line.startswith(("ninja: build stopped", "FAILED:")):
            picked.extend(lines[i:i + 3])
        if len(picked) >= limit:
            break
    text = "\n".join(dict.fromkeys(picked))  # keep order, drop repeats
    return text or "\n".join(lines[-limit:])


def _outcome(spec: BuildSpec, target: str, build_dir: Path) -> ExtensionLoad:
    """What a build of ``spec`` is, before it is built or found."""
    return ExtensionLoad(
        "ok", "", target, backend=spec.backend, archs=spec.archs, compiler=spec.compiler,
        host_compiler=f"{Path(spec.host_compiler).name} {spec.host_compiler_version}", flags=spec.flags,
        name=spec.name, digest=spec.digest, build_dir=str(build_dir),
        library=str(build_dir / f"{spec.name}.so"), log_path=str(build_dir / LOG_FILE),
        torch_version=spec.torch_version)


def build(
    target: str,
    *,
    pinned_archs: Sequence[str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    device: DeviceInfo | None = None,
    cache_root: Path | None = None,
    source_dir: Path = SOURCE_DIR,
    extra_ldflags: Sequence[str] = (),
) -> ExtensionLoad:
    """Build the operators for this machine's backend (or find the finished build), and load them.

    Never raises for a failed compile or a missing toolchain: see ``status`` / ``reason``.
    """
    call_start = time.perf_counter()
    spec, why = plan_build(device, pinned_archs, extra_cflags, source_dir, extra_ldflags=extra_ldflags)
    if spec is None:
        return ExtensionLoad("skipped", why, target)
    build_dir = spec.build_dir(target, cache_root)
    base = _outcome(spec, target, build_dir)
    marker = build_dir / MARKER_FILE
    if marker.is_file() and Path(base.library).is_file():
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        found = replace(base, cached=True, build_s=float(recorded.get("build_s", float("nan"))),
                        built_at=recorded.get("built_at", ""), reason=recorded.get("note", ""))
        result = load_library(found)
        return replace(result, seconds=time.perf_counter() - call_start) if result.status == "ok" else result
    compiled = _compile(spec, base, build_dir)
    if compiled.status != "ok":
        return compiled
    result = load_library(compiled)
    return replace(result, seconds=compiled.seconds) if result.status == "ok" else result


def _copy_sources(spec: BuildSpec, build_dir: Path) -> Path:
    """The sources beside the build: hipify writes its output beside its input, and the library is built
    from exactly the bytes that were hashed."""
    src = build_dir / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in (*spec.sources, *spec.headers):
        shutil.copy2(spec.source_dir / name, src / name)
    return src


def _compile(spec: BuildSpec, base: ExtensionLoad, build_dir: Path) -> ExtensionLoad:
    from torch.utils import cpp_extension

    src = _copy_sources(spec, build_dir)
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
                name=spec.name, sources=[str(src / n) for n in spec.sources], extra_cflags=list(spec.extra_cflags),
                extra_cuda_cflags=list(spec.extra_cuda_cflags), extra_ldflags=list(spec.extra_ldflags),
                build_directory=str(build_dir),
                with_cuda=spec.backend != "cpu", is_python_module=False, verbose=True)
    except Exception as exc:  # a compile error is a recorded outcome carrying the compiler's message
        errors = compiler_errors(log_path.read_text(encoding="utf-8", errors="replace") + "\n" + str(exc))
        first = next((ln for ln in errors.splitlines() if ERROR_LINE.search(ln)), str(exc)).strip()
        return replace(base, status="failed", reason=f"compile error: {first[:400]}",
                       seconds=time.perf_counter() - start, compiler_output=errors)
    seconds = time.perf_counter() - start
    built_at = started.isoformat(timespec="seconds")
    note = private_libstdcxx_note(Path(base.library))
    write_atomic(build_dir / MARKER_FILE, json.dumps(
        {"name": spec.name, "build_s": seconds, "built_at": built_at, "backend": spec.backend,
         "archs": list(spec.archs), "compiler": spec.compiler, "flags": spec.flags,
         "torch": spec.torch_version, "note": note}, indent=2) + "\n")
    # cpp_extension.load has loaded the library already; load_library records it (a no-op reload).
    return replace(base, cached=False, seconds=seconds, build_s=seconds, built_at=built_at, reason=note)


# std::ostream::_M_insert<long>: compiled into libstdc++.so, so a library that defines it carries its own copy.
LIBSTDCXX_PROBE = "_ZNSo9_M_insertIlEERSoT_"


def private_libstdcxx_note(library: Path) -> str:
    """A note when the host compiler linked libstdc++ into the library (the H100 machine's $CXX wrapper
    does): C++ streams in it then mix two libstdc++ copies, and formatting a number there crashes (H100)
    or prints nothing (Debian). '' when the library uses the process's libstdc++, or nm is missing."""
    result = run_tool("nm", ["nm", "--defined-only", str(library)], timeout_s=120)
    if result.status != "ok" or LIBSTDCXX_PROBE not in result.stdout:
        return ""
    return ("note: the host compiler linked a private copy of libstdc++ into the library (it defines "
            "std::ostream::_M_insert<long>); the operators format no numbers through C++ streams because of it")
