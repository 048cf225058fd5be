"""ROCm device libraries for clang's HIP device compiles: the distribution's bitcode, completed per architecture.

clang refuses an architecture whose ``oclc_isa_version_<arch>.bc`` is missing, and Debian's rocm-device-libs has none
for gfx942 or any gfx11: those one-constant files are built here as ROCm-Device-Libs builds them and laid beside
links to the installed bitcode (see docs/architecture.md).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# ROCm-Device-Libs oclc/CMakeLists.txt (OCLC_ISA_TARGETS): major * 1000 + minor * 100 + stepping.
ISA_VERSIONS = {"gfx90a": 9010, "gfx942": 9402, "gfx1100": 11000, "gfx1151": 11501}
# cmake/OCL.cmake's CLANG_OCL_FLAGS, as ROCm-Device-Libs compiles each oclc control.
OCL_FLAGS = ("-x", "cl", "-Xclang", "-cl-std=CL2.0", "--target=amdgcn-amd-amdhsa", "-fvisibility=protected",
             "-nogpulib", "-cl-no-stdinc", "-Xclang", "-mcode-object-version=none", "-emit-llvm", "-c")
# Where distributions and ROCm put the bitcode; $HIP_DEVICE_LIB_PATH (clang's own variable) first.
SEARCH = ("/opt/rocm/amdgcn/bitcode", "/opt/rocm/lib/llvm/lib/clang/*/lib/amdgcn/bitcode",
          "/usr/lib/*/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode")
INSTALL_HINT = "apt-get install rocm-device-libs, or set HIP_DEVICE_LIB_PATH to a directory holding ocml.bc"


def isa_library(arch: str) -> str:
    return f"oclc_isa_version_{arch.removeprefix('gfx')}.bc"


def installed_dir() -> Path | None:
    """The first directory holding ocml.bc and ockl.bc."""
    candidates = [p for p in os.environ.get("HIP_DEVICE_LIB_PATH", "").split(os.pathsep) if p]
    candidates += [hit for pattern in SEARCH for hit in sorted(glob.glob(pattern))]
    return next((Path(p) for p in candidates if (Path(p) / "ocml.bc").is_file() and (Path(p) / "ockl.bc").is_file()),
                None)


def identity(libdir: Path) -> str:
    """What a compile's outcome depends on in the libraries: their names and sizes."""
    files = sorted((p.name, p.stat().st_size) for p in libdir.glob("*.bc"))
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]


def build_isa_library(clang: str, arch: str, out: Path) -> None:
    """``oclc_isa_version_<arch>.bc`` from the one-line OpenCL source ROCm-Device-Libs configures for it."""
    if arch not in ISA_VERSIONS:
        raise ValueError(f"no ISA version known for {arch}; known: {', '.join(ISA_VERSIONS)}")
    with tempfile.TemporaryDirectory(prefix="gpulab-oclc-") as tmp:
        source = Path(tmp) / f"isa_version_{arch.removeprefix('gfx')}.cl"
        source.write_text(f"const __constant int __oclc_ISA_version = {ISA_VERSIONS[arch]};\n")
        result = subprocess.run([clang, *OCL_FLAGS, str(source), "-o", str(out)], capture_output=True, text=True,
                                check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building {out.name} with {clang} failed: {result.stderr.strip()[-500:]}")


def device_lib_dir(clang: str, arch: str, cache_dir: Path) -> Path:
    """A directory clang can take as ``--rocm-device-lib-path`` for ``arch``: the installed one where it covers
    the architecture, else a cached overlay of links to it plus the ISA-version library built by ``clang``."""
    installed = installed_dir()
    if installed is None:
        raise FileNotFoundError(f"ROCm device libraries not found (ocml.bc): {INSTALL_HINT}")
    if (installed / isa_library(arch)).is_file():
        return installed
    overlay = cache_dir / "device-libs" / f"{arch}-{identity(installed)}"
    if (overlay / isa_library(arch)).is_file():
        return overlay
    overlay.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{arch}-", dir=overlay.parent))
    try:
        for lib in installed.glob("*.bc"):
            (tmp / lib.name).symlink_to(lib.resolve())
        build_isa_library(clang, arch, tmp / isa_library(arch))
        try:
            tmp.rename(overlay)  # atomic: a concurrent job's identical overlay may already be there
        except OSError:
            if not (overlay / isa_library(arch)).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return overlay
