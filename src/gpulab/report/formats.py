"""One way to write each quantity on the page: sizes in binary units with their element count, times with
their unit, ceiling methods in words, and the page's title from the platforms the run measured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpulab.core.dtypes import ITEMSIZE

BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
# How a ceiling's method reads (gpulab.core.ceilings names them as code); a Triton sweep entry is spelled out.
METHOD_WORDS = {
    "memcpy": "memcpy (a tensor copy)",
    "memcpy (graph replay)": "memcpy replayed from a device graph",
    "memcpy (timed beside the case)": "memcpy timed beside the case",
    "torch.neg": "torch.neg (elementwise negation)",
    "torch.sum": "torch.sum (a reduction)",
    "torch.add": "torch.add (elementwise sum)",
    "torch.compile": "torch.compile (Inductor's kernel)",
    "torch.matmul": "torch.matmul",
}
SWEEP = re.compile(r"triton b(\d+) w(\d+)")
FASTEST_ROW = re.compile(r"(.+) \(fastest row; above every method\)")


def binary_bytes(value: float) -> str:
    """``1 GiB``, ``1.5 MiB``, ``384 B``: three significant digits, binary units."""
    if value is None or not math.isfinite(float(value)):
        return "–"
    for unit, scale in BINARY_UNITS:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def size_words(size: Any, dtype: str, tensor_bytes: Any = None) -> str:
    """A benchmark size as the page writes it: ``1 GiB · 268,435,456 fp32`` (a vector) or
    ``256 MiB · 4096 × 16384 bf16`` (a rows × columns shape)."""
    text = str(size)
    shape = [int(p) for p in text.split("x")] if re.fullmatch(r"\d+(x\d+)*", text) else []
    elements = math.prod(shape) if shape else None
    nbytes = _number(tensor_bytes)
    if math.isnan(nbytes) and elements is not None and dtype in ITEMSIZE:
        nbytes = float(elements * ITEMSIZE[dtype])
    count = f"{shape[0]:,}" if len(shape) == 1 else " × ".join(str(p) for p in shape) if shape else text
    return f"{binary_bytes(nbytes)} · {count} {dtype}" if not math.isnan(nbytes) else f"{count} {dtype}"


def method_words(method: Any) -> str:
    """A ceiling method in words: ``triton b8192 w8`` -> ``Triton kernel, 8,192-element blocks, 8 warps``."""
    text = "" if method is None or (isinstance(method, float) and math.isnan(method)) else str(method)
    if match := SWEEP.fullmatch(text):
        return f"Triton kernel, {int(match.group(1)):,}-element blocks, {match.group(2)} warps"
    if match := FASTEST_ROW.fullmatch(text):
        return f"the {match.group(1)} row itself, faster than every method"
    return METHOD_WORDS.get(text, text)


def milliseconds(value: Any) -> str:
    """A time with its unit, in the unit that keeps it readable: ``812 µs``, ``4.03 ms``, ``1.20 s``."""
    ms = _number(value)
    if math.isnan(ms):
        return "–"
    if ms < 1:
        return f"{ms * 1e3:.3g} µs"
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1e3:.3g} s"


def platform(device: Mapping[str, Any]) -> str:
    """What a target ran on, as a title names it: the GPU's name, else ``CPU``."""
    name = str(device.get("name") or "").strip()
    if device.get("gpu_available") and name:
        return name
    return "CPU" if device.get("backend") in (None, "", "cpu") or not device.get("gpu_available") else name


def platforms_title(devices: Mapping[str, Mapping[str, Any]], prefix: str = "gpulab") -> str:
    """``gpulab: NVIDIA H100 80GB HBM3 and CPU`` from the targets' environment captures."""
    # GPUs first: a run's accelerators are what its page is about.
    ordered = sorted((d for d in devices.values() if d), key=lambda d: not d.get("gpu_available"))
    names = list(dict.fromkeys(platform(d) for d in ordered))
    if not names:
        return f"{prefix} report"
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{prefix}: {joined}"


def anchor(*parts: Any) -> str:
    """An element id from its parts, as the page's links spell it: ``goal-h100-gelu-triton-268435456-fp32``."""
    text = "-".join(str(p) for p in parts)
    return re.sub(r"-+", "-", "".join(ch if ch.isalnum() else "-" for ch in text)).strip("-").lower()


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan
