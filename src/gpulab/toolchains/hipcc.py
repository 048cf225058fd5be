"""HIP C++ device code compiled for AMD architectures, resources read from the assembly.

Two compilers: a current clang (Debian's clang-19 with lld-19) compiles every HIP source for every AMD
architecture, device code only, linked against the ROCm device libraries (``device_libs``) into a code object;
Debian's hipcc (ROCm 5.2, clang 15), the compiler a ROCm 5.2 install builds the programs with, compiles the
architectures its device libraries cover. The ``compiler`` column says which made each row.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulab.core.ops import OPS
from gpulab.core.paths import HIP_SOURCES, PACKAGE_DIR, kernel_relpath
from gpulab.core.tools import find_compiler
from gpulab.toolchains import device_libs
from gpulab.toolchains.archs import Arch
from gpulab.toolchains.resources import amdgcn_kernels, demangle, elf_symbol_sizes

HIPCC_FLAGS = ("-O3", "-std=c++17", "--cuda-device-only", "-S")
CLANG = "clang-19"
LLD = "ld.lld-19"  # clang-19 links AMD code objects with its own lld
CLANG_FLAGS = ("-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-c", "-save-temps")
SOURCE_FLAGS = ("-O3", "-std=c++17")  # the project's own HIP units, with clang
CLANG_HINT = "apt-get install clang-19 lld-19"
DTYPES = (("bfloat16", "bf16"), ("__half", "fp16"), ("half", "fp16"), ("c10::Half", "fp16"), ("float", "fp32"))
MAX_MESSAGE = 2000


def hip_sources() -> list[Path]:
    """The HIP translation units (gpulab.core.paths.HIP_SOURCES), each compiled and tabled for every AMD arch; its
    directory's headers are part of its cache key."""
    return [PACKAGE_DIR / s for s in HIP_SOURCES]


def _with_headers(source: Path) -> list[Path]:
    """The source and the headers beside it: what its compile (and cache key) depends on."""
    return sorted({source, *source.parent.glob("*.h"), *source.parent.glob("*.cuh")})


def hip_inputs() -> list[str]:
    """Every file the HIP compiles read, for the rule's input: the HIP units, the extension's GPU unit that
    PyTorch hipifies (rocm_extension), and the headers beside them."""
    from gpulab.toolchains import rocm_extension

    files = {p for source in hip_sources() for p in _with_headers(source)} | set(rocm_extension.sources())
    return sorted(str(p) for p in files)


def _env() -> dict[str, str]:
    # Debian's hipcc needs the platform named; without a GPU it cannot detect it.
    return {**os.environ, "HIP_PLATFORM": "amd"}


@dataclass(frozen=True)
class Toolchain:
    """One HIP compiler for one architecture: how to call it and what its rows are labelled."""

    kind: str  # hipcc | clang
    exe: str
    label: str  # the compiler column: hipcc (clang 15.0.7) | clang 19.1.7
    flags: tuple[str, ...]
    libdir: Path | None = None  # clang: the device libraries it links

    def command(self, source: Path, a: Arch, out: Path, flags: tuple[str, ...]) -> list[str]:
        libs = [f"--rocm-device-lib-path={self.libdir}"] if self.libdir else []
        return [self.exe, f"--offload-arch={a.name}", *self.flags, *flags, *libs, "-o", str(out), str(source)]

    def key(self) -> list[Any]:
        libs = device_libs.identity(self.libdir) if self.libdir else ""
        return [self.label, self.flags, libs]


def clang_version(exe: str) -> str | None:
    """The clang version ``exe --version`` names (hipcc prints its clang's)."""
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False, env=_env()).stdout
    match = re.search(r"clang version (\S+)", out)
    return match.group(1) if match else None


def hipcc_version(hipcc: str) -> str:
    version = clang_version(hipcc)
    return f"hipcc (clang {version})" if version else "hipcc"


def hipcc_covers(a: Arch) -> bool:
    """Whether Debian's hipcc can compile for ``a``: its device libraries have the architecture's ISA library."""
    libdir = device_libs.installed_dir()
    return libdir is not None and (libdir / device_libs.isa_library(a.name)).is_file()


def toolchain(kind: str, a: Arch, cache_dir: Path) -> Toolchain | str:
    """The toolchain, or why it cannot compile for ``a`` (a reason a user can act on)."""
    if kind == "hipcc":
        hipcc = find_compiler("hipcc", toolkit_dirs=False)
        if hipcc is None:
            return "hipcc is not installed: apt-get install hipcc"
        return Toolchain("hipcc", hipcc, hipcc_version(hipcc), HIPCC_FLAGS)
    clang = shutil.which(CLANG)
    if clang is None:
        return f"{CLANG} is not installed: {CLANG_HINT}"
    if shutil.which(LLD) is None:
        return f"{LLD} is not installed (clang links AMD code objects with lld): {CLANG_HINT}"
    try:
        libdir = device_libs.device_lib_dir(clang, a.name, cache_dir)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        return str(exc)
    return Toolchain("clang", clang, f"clang {clang_version(clang) or 'unknown'}", CLANG_FLAGS, libdir)


def _digest(source: Path, a: Arch, tc: Toolchain, flags: tuple[str, ...], key: str) -> str:
    h = hashlib.sha256(json.dumps([tc.key(), a.name, variant(flags), key], default=str).encode())
    for path in _with_headers(source):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:24]


def variant(flags: tuple[str, ...]) -> str:
    """The table's variant column: the flags, less include directories (they name this machine's paths)."""
    shown = [f for i, f in enumerate(flags) if f != "-isystem" and (i == 0 or flags[i - 1] != "-isystem")]
    return " ".join(shown)


def compile_source(source: Path, a: Arch, cache_dir: Path, kind: str = "clang", *, name: str | None = None,
                   flags: tuple[str, ...] | None = None, key: str = "") -> list[dict[str, Any]]:
    """Rows for every kernel of one HIP source on one AMD arch; one skipped/failed row if it cannot.
    ``name``: the source column (default: its path under kernels/); ``flags``: the language flags (default
    SOURCE_FLAGS with clang); ``key``: anything else the outcome depends on, for the cache."""
    tc = toolchain(kind, a, cache_dir)
    flags = (() if kind == "hipcc" else SOURCE_FLAGS) if flags is None else flags
    shown = HIPCC_FLAGS + flags if kind == "hipcc" else CLANG_FLAGS + flags
    base = {"source": name or kernel_relpath(source), "variant": variant(shown)}
    if isinstance(tc, str):
        return [{**base, "status": "skipped", "reason": tc, "compiler": kind if kind == "hipcc" else CLANG}]
    path = cache_dir / a.name / f"hip-{tc.kind}-{source.stem}-{_digest(source, a, tc, flags, key)}.json"
    if path.is_file():
        return [{**row, "cached": True} for row in json.loads(path.read_text())]
    rows = [{**base, **row, "compiler": tc.label, "cached": False} for row in _compile(tc, source, a, flags)]
    if all(r["status"] != "failed" for r in rows):  # a failure may be passing trouble: compile again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([{k: v for k, v in r.items() if k != "cached"} for r in rows]))
        tmp.replace(path)
    return rows


def _compile(tc: Toolchain, source: Path, a: Arch, flags: tuple[str, ...]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gpulab-hip-") as tmp:
        out = Path(tmp) / ("device.s" if tc.kind == "hipcc" else "device.o")
        start = time.perf_counter()
        # -save-temps writes the device assembly beside the object, in the working directory.
        result = subprocess.run(tc.command(source, a, out, flags), capture_output=True, text=True, check=False,
                                env=_env(), cwd=tmp if tc.kind == "clang" else source.parent)
        seconds = time.perf_counter() - start
        asm_path = out if tc.kind == "hipcc" else next(Path(tmp).glob(f"*-{a.name}*.s"), None)
        if result.returncode != 0 or not out.is_file() or asm_path is None:
            return [_refusal(tc, result.stderr, a, seconds)]
        kernels = amdgcn_kernels(asm_path.read_text())
        waves = {figures["wavefront_size"] for figures in kernels.values()}
        if waves - {a.warp_size}:  # the wave mode the table's family and occupancy assume
            return [{"status": "failed", "compile_s": seconds, "reason": f"{tc.kind} --offload-arch={a.name} made "
                     f"wave{'/'.join(map(str, sorted(waves)))} code; {a.name} ({a.family}) runs wave{a.warp_size}"}]
        if tc.kind == "clang":  # the linked code object's own sizes
            sizes = elf_symbol_sizes(out.read_bytes())
            for symbol, figures in kernels.items():
                figures["code_bytes"] = sizes.get(symbol, figures["code_bytes"])
    return [_kernel_row(symbol, figures, seconds) for symbol, figures in kernels.items()]


def _refusal(tc: Toolchain, stderr: str, a: Arch, seconds: float) -> dict[str, Any]:
    """An arch the installed compiler does not know (or lacks device libraries for) is skipped, with its
    words; any other error is a failed compile."""
    errors = [line for line in stderr.splitlines() if "error" in line] or stderr.strip().splitlines()[-5:]
    message = "\n".join(errors)[:MAX_MESSAGE]
    unsupported = any(s in message for s in ("invalid target ID", "cannot find ROCm device library",
                                              "cannot find HIP runtime"))
    if "cannot find HIP runtime" in message:
        message += " (the HIP headers: apt-get install libamdhip64-dev)"
    return {"status": "skipped" if unsupported else "failed", "compile_s": seconds,
            "reason": f"{tc.kind} --offload-arch={a.name}: {message}"}


def _kernel_row(symbol: str, figures: dict[str, Any], seconds: float) -> dict[str, Any]:
    name = demangle(symbol)
    short = re.sub(r"^void\s+", "", name.split("(", 1)[0])  # gpulab::kernels::softmax_warp_kernel<float, 32>
    lower = name.lower()
    op = next((o for o in sorted(OPS, key=len, reverse=True) if o in short.lower()), "")  # longest name first
    dtype = next((d for token, d in DTYPES if token.lower() in lower), "")
    figures = {k: v for k, v in figures.items() if k not in ("compiler_waves_per_simd", "wavefront_size")}
    # Occupancy at the kernel's launch bound (the largest workgroup it may be launched with).
    threads = figures.pop("max_flat_workgroup_size")
    return {"status": "ok", "kernel": short, "op": op, "dtype": dtype, "compile_s": seconds, "threads": threads,
            **figures}
