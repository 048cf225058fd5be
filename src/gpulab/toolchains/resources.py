"""Resource figures read from compiler output: AMDGCN assembly notes, ptxas -v logs, cubin ELF sections."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from typing import Any

import yaml

_AMD_METADATA = re.compile(r"\.amdgpu_metadata\s*\n(---.*?\n\.\.\.)\s*\n\s*\.end_amdgpu_metadata", re.S)
_KERNEL_START = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)", re.M)
_CODE_LEN = re.compile(r";\s*codeLenInByte\s*=\s*(\d+)")
_OCCUPANCY_NOTE = re.compile(r";\s*Occupancy:\s*(\d+)")


def amdgcn_kernels(asm: str) -> dict[str, dict[str, Any]]:
    """Per kernel (symbol name): registers, spills, scratch, LDS and code size from the assembly's
    amdhsa.kernels metadata (YAML) and the compiler's resource comments."""
    match = _AMD_METADATA.search(asm)
    if not match:
        raise ValueError("no .amdgpu_metadata block in the AMDGCN assembly")
    meta = yaml.safe_load(match.group(1))
    notes = _notes_after_kernel_starts(asm)
    out = {}
    for k in meta.get("amdhsa.kernels", []):
        name = k[".name"]
        code_bytes, compiler_occupancy = notes.get(name, (None, None))
        out[name] = {
            "registers": int(k[".vgpr_count"]) + int(k.get(".agpr_count", 0)),
            "sgprs": int(k[".sgpr_count"]),
            "spilled_regs": int(k.get(".vgpr_spill_count", 0)) + int(k.get(".sgpr_spill_count", 0)),
            "scratch_bytes": int(k[".private_segment_fixed_size"]),
            "lds_bytes": int(k[".group_segment_fixed_size"]),
            "code_bytes": code_bytes,
            "compiler_waves_per_simd": compiler_occupancy,
            "max_flat_workgroup_size": int(k.get(".max_flat_workgroup_size", 1024)),
            "wavefront_size": int(k[".wavefront_size"]),
        }
    return out


def _notes_after_kernel_starts(asm: str) -> dict[str, tuple[int | None, int | None]]:
    """The first codeLenInByte / Occupancy comments after each kernel's .amdhsa_kernel directive."""
    starts = list(_KERNEL_START.finditer(asm))
    notes = {}
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(asm)
        chunk = asm[start.end() : end]
        code, occ = _CODE_LEN.search(chunk), _OCCUPANCY_NOTE.search(chunk)
        notes[start.group(1)] = (int(code.group(1)) if code else None, int(occ.group(1)) if occ else None)
    return notes


_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_resources(log: str) -> dict[str, int]:
    """Registers, spill bytes and stack frame from ptxas -v (one entry function)."""
    used, frame = _PTXAS_USED.search(log), _PTXAS_FRAME.search(log)
    if not used or not frame:
        raise ValueError(f"no resource lines in the ptxas log: {log.strip()[:300]!r}")
    stack, stores, _loads = (int(g) for g in frame.groups())
    # ptxas reports bytes per thread; /4 makes it 32-bit registers, comparable with AMD's spill counts.
    return {"registers": int(used.group(1)), "spilled_regs": stores // 4, "scratch_bytes": stack}


def elf_section_size(elf: bytes, name: str) -> int | None:
    """Size of one section of an ELF64 little-endian object (a cubin or a code object)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 object")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset = headers[shstrndx][4]
    for h in headers:
        end = elf.index(b"\0", strtab_offset + h[0])
        if elf[strtab_offset + h[0] : end].decode() == name:
            return int(h[5])
    return None


def elf_symbol_sizes(elf: bytes) -> dict[str, int]:
    """Size of every function symbol of an ELF64 little-endian object (a linked AMD code object): its machine code."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 object")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    sizes = {}
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in headers:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        strtab = headers[link][4]
        for i in range(size // entsize):
            st_name, st_info, _other, _shndx, _value, st_size = struct.unpack_from("<IBBHQQ", elf, offset + i * entsize)
            if st_info & 0xF == 2:  # STT_FUNC
                sizes[elf[strtab + st_name : elf.index(b"\0", strtab + st_name)].decode()] = int(st_size)
    return sizes


def demangle(symbol: str) -> str:
    """C++ symbol as source-level text (c++filt from binutils); the symbol itself without it."""
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if not tool or not symbol.startswith("_Z"):
        return symbol
    result = subprocess.run([tool, symbol], capture_output=True, text=True, check=False)
    return result.stdout.strip() or symbol
