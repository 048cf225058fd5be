"""Parse what the vendor tools say about the GPU: ``rocm-smi --json``, ``rocminfo``, ``nvidia-smi -q``.

Each parser takes the tool's recorded text and returns plain dicts; tests run them on recorded
outputs of real machines (tests/fixtures/).
"""

from __future__ import annotations

import json
import re
from typing import Any


def _first(card: dict[str, str], *names: str) -> str | None:
    lowered = {k.lower().rstrip(":").strip(): v for k, v in card.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value not in (None, "", "N/A"):
            return value
    return None


def parse_rocm_smi_json(text: str) -> dict[str, Any]:
    """``rocm-smi --showproductname --showdriverversion --showmeminfo vram --showuse --json``.

    Key spellings changed across ROCm releases ("Card series" / "Card Series", "Device Name"),
    so lookups are case-insensitive with fallbacks.
    """
    if not text.strip():
        return {"devices": [], "driver_version": None}
    data = json.loads(text)
    devices = []
    for key, card in data.items():
        if not key.startswith("card") or not isinstance(card, dict):
            continue
        total = _first(card, "VRAM Total Memory (B)")
        used = _first(card, "VRAM Total Used Memory (B)")
        devices.append(
            {
                "card": key,
                "product": _first(card, "Card Series", "Device Name", "Card Model"),
                "model": _first(card, "Card Model", "Device ID"),
                "vendor": _first(card, "Card Vendor"),
                "sku": _first(card, "Card SKU"),
                "gfx_version": _first(card, "GFX Version"),
                "vram_total_bytes": int(total) if total and total.isdigit() else None,
                "vram_used_bytes": int(used) if used and used.isdigit() else None,
                "gpu_use_pct": float(u) if (u := _first(card, "GPU use (%)")) and _is_number(u) else None,
            }
        )
    system = data.get("system", {}) if isinstance(data.get("system"), dict) else {}
    driver = _first(system, "Driver version") or next(
        (d for c in data.values() if isinstance(c, dict) and (d := _first(c, "Driver version"))), None
    )
    return {"devices": devices, "driver_version": driver}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_rocminfo(text: str) -> list[dict[str, str]]:
    """GPU agents of ``rocminfo``: their ISA name (gfx...), marketing name and compute units."""
    agents: list[dict[str, str]] = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(r"\s{2}(\S[^:]*?):\s+(.*\S)\s*$", line)
            if m and m[1] not in fields:
                fields[m[1]] = m[2]
        if fields.get("Device Type") == "GPU":
            agents.append(
                {
                    "name": fields.get("Name", ""),
                    "marketing_name": fields.get("Marketing Name", ""),
                    "compute_units": fields.get("Compute Unit", ""),
                    "vendor": fields.get("Vendor Name", ""),
                }
            )
    return agents


def parse_nvidia_smi_q(text: str) -> dict[str, Any]:
    """Driver/CUDA versions and per-GPU product, memory and utilisation from ``nvidia-smi -q``."""
    result: dict[str, Any] = {"driver_version": None, "cuda_version": None, "devices": []}
    device: dict[str, Any] | None = None
    section: list[str] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if re.match(r"^GPU [0-9A-Fa-f:.]+$", line):
            device = {"bus_id": line.split(" ", 1)[1]}
            result["devices"].append(device)
            section = []
            continue
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        level = max(0, indent // 4 - 1)
        section = section[:level]
        if not sep or not value:
            section.append(key)
            continue
        if device is None:
            if key == "Driver Version":
                result["driver_version"] = value
            elif key == "CUDA Version":
                result["cuda_version"] = value
            continue
        path = (*section, key)
        if path == ("Product Name",):
            device["product"] = value
        elif path == ("FB Memory Usage", "Total"):
            device["memory_total"] = value
        elif path == ("FB Memory Usage", "Used"):
            device["memory_used"] = value
        elif path == ("Utilization", "Gpu"):
            device["gpu_use"] = value
        elif path == ("Product Architecture",):
            device["architecture"] = value
    return result
