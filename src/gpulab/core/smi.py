"""Parse what the vendor tools say about the GPU: ``rocm-smi --json``, ``rocminfo``, ``nvidia-smi -q``.

Each parser takes the tool's recorded text and returns plain dicts; tests run them on recorded
outputs of real machines (tests/fixtures/).
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from gpulab.core.tools import run_tool


def _first(card: dict[str, str], *names: str) -> str | None:
    lowered = {k.lower().rstrip(":").strip(): v for k, v in card.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value not in (None, "", "N/A"):
            return value
    return None


def _bytes(card: dict[str, str], name: str) -> int | None:
    value = _first(card, name)
    return int(value) if value and value.isdigit() else None


def parse_rocm_smi_json(text: str) -> dict[str, Any]:
    """``rocm-smi --showproductname --showdriverversion --showmeminfo vram gtt --showuse --json``.

    Key spellings changed across ROCm releases ("Card series" / "Card Series", "Device Name"),
    so lookups are case-insensitive with fallbacks. GTT is the host memory the GPU maps: on an iGPU
    it is most of the GPU's memory, VRAM being only the firmware's carve-out.
    """
    if not text.strip():
        return {"devices": [], "driver_version": None}
    data = json.loads(text)
    devices = []
    for key, card in data.items():
        if not key.startswith("card") or not isinstance(card, dict):
            continue
        devices.append(
            {
                "card": key,
                "product": _first(card, "Card Series", "Device Name", "Card Model"),
                "model": _first(card, "Card Model", "Device ID"),
                "vendor": _first(card, "Card Vendor"),
                "sku": _first(card, "Card SKU"),
                "gfx_version": _first(card, "GFX Version"),
                "vram_total_bytes": _bytes(card, "VRAM Total Memory (B)"),
                "vram_used_bytes": _bytes(card, "VRAM Total Used Memory (B)"),
                "gtt_total_bytes": _bytes(card, "GTT Total Memory (B)"),
                "gtt_used_bytes": _bytes(card, "GTT Total Used Memory (B)"),
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


# amd-smi prints memory in MB of 2^20 bytes (amdsmi_cli divides the library's bytes by 1024 * 1024).
MIB = 1024 * 1024
AMD_SMI_MEMORY = {"total_vram": "vram_total_bytes", "used_vram": "vram_used_bytes", "total_gtt": "gtt_total_bytes",
                  "used_gtt": "gtt_used_bytes"}


def _amd_smi_mib(value: Any) -> int | None:
    """``{"value": 512, "unit": "MB"}`` (JSON) or ``512 MB`` (text) as bytes; N/A as None."""
    if isinstance(value, dict):
        value = f"{value.get('value')} {value.get('unit', '')}"
    match = re.fullmatch(r"\s*(\d+)\s*MB\s*", str(value))
    return int(match[1]) * MIB if match else None


def _amd_smi_text(text: str) -> list[dict[str, Any]]:
    """amd-smi's plain output (``GPU: 0`` then indented ``KEY: value`` lines) as the JSON form's list."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for line in text.splitlines():
        match = re.match(r"^(\s*)([A-Z0-9_]+):\s*(.*?)\s*$", line)
        if not match:
            continue
        indent, key, value = len(match[1]), match[2].lower(), match[3]
        if indent == 0 and key == "gpu":
            gpus.append({"gpu": int(value) if value.isdigit() else value})
            stack = [(0, gpus[-1])]
            continue
        while stack and stack[-1][0] >= indent and len(stack) > 1:
            stack.pop()
        if not stack:
            continue
        if value:
            stack[-1][1][key] = value
        else:
            stack[-1][1][key] = {}
            stack.append((indent, stack[-1][1][key]))
    return gpus


def parse_amd_smi(text: str) -> list[dict[str, Any]]:
    """Per GPU, product and memory from ``amd-smi static --asic --vram`` and ``amd-smi metric --mem-usage``,
    in ``--json`` form (a list, or ``{"gpu_data": [...]}`` since ROCm 6.4) or plain text; N/A fields are None."""
    if not text.strip():
        return []
    if text.lstrip()[:1] in "[{":
        data = json.loads(text)
        gpus = data.get("gpu_data", []) if isinstance(data, dict) else data
    else:
        gpus = _amd_smi_text(text)
    devices = []
    for gpu in gpus:
        asic = gpu.get("asic") if isinstance(gpu.get("asic"), dict) else {}
        vram = gpu.get("vram") if isinstance(gpu.get("vram"), dict) else {}
        usage = gpu.get("mem_usage") if isinstance(gpu.get("mem_usage"), dict) else {}
        device = {"gpu": gpu.get("gpu"), "product": asic.get("market_name"), "vram_type": vram.get("type"),
                  **{ours: _amd_smi_mib(usage.get(theirs)) for theirs, ours in AMD_SMI_MEMORY.items()}}
        if device["vram_total_bytes"] is None:
            device["vram_total_bytes"] = _amd_smi_mib(vram.get("size"))
        devices.append(device)
    return devices


def parse_rocminfo(text: str) -> list[dict[str, str]]:
    """GPU agents of ``rocminfo``: their ISA name (gfx...), marketing name and compute units."""
    agents: list[dict[str, str]] = []
    for block in re.split(r"(?:^|\n)\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
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


def parse_rocminfo_caches(text: str) -> list[dict[str, Any]]:
    """Per GPU agent of ``rocminfo``: its ISA name and its ``Cache Info`` levels in bytes (``L2: 4096(0x1000) KB``
    -> ``l2_bytes``; L3 is the Infinity Cache, the MALL)."""
    agents: list[dict[str, Any]] = []
    for block in re.split(r"(?:^|\n)\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        if not re.search(r"^\s+Device Type:\s+GPU\s*$", block, re.MULTILINE):
            continue
        name = re.search(r"^\s{2}Name:\s+(\S+)", block, re.MULTILINE)
        agent: dict[str, Any] = {"name": name[1] if name else ""}
        for level, kib in re.findall(r"^\s+(L[1-9]):\s+(\d+)(?:\(0x[0-9a-fA-F]+\))?\s*KB\s*$", block,
                                     re.MULTILINE):
            agent.setdefault(f"{level.lower()}_bytes", int(kib) * 1024)
        agents.append(agent)
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


# ------------------------------------------------------------------------------ machine state per cell

NVIDIA_QUERY = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_throttle_reasons.active")
# nvidia-smi's clocks_throttle_reasons bits that mean the clocks were pulled down by the hardware or the
# driver (power cap, hardware slowdown, thermal, power brake); idle and application-clock bits do not.
NVIDIA_THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sync_boost", 0x40: "sw_thermal",
                        0x80: "hw_thermal", 0x100: "hw_power_brake"}
ROCM_STATE_ARGS = ("--showclocks", "--showtemp", "--showpower", "--json")


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    return float(match[0]) if match else None


def _throttle_names(bits: int) -> str:
    """The NVIDIA_THROTTLE_BITS set in a clocks-throttle-reasons mask, comma-separated ('' for none)."""
    return ",".join(name for bit, name in NVIDIA_THROTTLE_BITS.items() if bits & bit)


def parse_nvidia_state(text: str, index: int = 0) -> dict[str, Any]:
    """One GPU's line of ``nvidia-smi --query-gpu=<NVIDIA_QUERY> --format=csv,noheader,nounits``."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        raise ValueError("nvidia-smi printed no GPU")
    fields = [f.strip() for f in lines[min(index, len(lines) - 1)].split(",")]
    if len(fields) != len(NVIDIA_QUERY):
        raise ValueError(f"nvidia-smi printed {len(fields)} fields, expected {len(NVIDIA_QUERY)}: {lines[0]!r}")
    reasons = None
    if fields[4].lower().startswith("0x"):
        reasons = _throttle_names(int(fields[4], 16))
    return {"sm_clock_mhz": _float(fields[0]), "mem_clock_mhz": _float(fields[1]), "temp_c": _float(fields[2]),
            "power_w": _float(fields[3]), "throttle": reasons}


def parse_rocm_state(text: str) -> dict[str, Any]:
    """The first card of ``rocm-smi --showclocks --showtemp --showpower --json`` (keys as rocm_smi.py prints
    them: "sclk clock speed:" "(1700Mhz)", "Temperature (Sensor edge) (C)", "... Graphics Package Power (W)").
    rocm-smi reports no throttle reasons before its gpu_metrics ``throttle_status``: None (unknown) then."""
    if not text.strip():
        raise ValueError("rocm-smi printed nothing (no AMD GPU visible)")
    data = json.loads(text)
    card = next((v for k, v in data.items() if k.startswith("card") and isinstance(v, dict)), None)
    if card is None:
        raise ValueError("rocm-smi printed no card")
    power = next((v for k, v in card.items() if "Graphics Package Power (W)" in k and "Max" not in k), None)
    temp = _first(card, "Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")
    throttle = _first(card, "throttle_status")
    return {"sm_clock_mhz": _float(_first(card, "sclk clock speed")), "mem_clock_mhz":
            _float(_first(card, "mclk clock speed")), "temp_c": _float(temp), "power_w": _float(power),
            "throttle": None if throttle is None else ("" if throttle.strip() in ("0", "0x0") else throttle)}


def nvml_state(pynvml: Any, handle: Any) -> dict[str, Any]:
    """The fields of NVIDIA_QUERY from NVML itself, as :func:`parse_nvidia_state` gives them (nvidia-smi reads the
    same counters through NVML)."""
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return {"sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            "temp_c": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "throttle": _throttle_names(int(reasons(handle)))}


@functools.cache
def _nvml() -> tuple[Any, Any] | None:
    """(pynvml, the handle of the GPU torch uses), started once per process; None where NVML is not there."""
    try:
        import pynvml

        from gpulab.core.energy import nvml_handle

        pynvml.nvmlInit()
        return pynvml, nvml_handle(pynvml)
    except Exception:  # not installed, no driver, no permission: nvidia-smi is asked instead
        return None


def gpu_state(backend: str, timeout_s: float = 10) -> dict[str, Any]:
    """Clocks, temperature, power and throttle reasons now, from the vendor tool of ``backend``. On NVIDIA from
    NVML where it answers: a cell reads the state before and after each group of cases, and starting nvidia-smi
    each time held the device for longer than the group's own measurements of small sizes.

    Never raises: without a GPU or the tool, ``{"available": False, "reason": ...}``.
    """
    if backend == "cuda" and (nvml := _nvml()) is not None:
        try:
            return {"available": True, **nvml_state(*nvml)}
        except Exception:  # a field this driver does not report: the tool gives what it can
            pass
    if backend == "cuda":
        tool = run_tool("nvidia-smi", ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_QUERY)}",
                                       "--format=csv,noheader,nounits"], timeout_s)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        parse = lambda text: parse_nvidia_state(text, int(visible) if visible.isdigit() else 0)  # noqa: E731
    elif backend == "rocm":
        tool = run_tool("rocm-smi", ["rocm-smi", *ROCM_STATE_ARGS], timeout_s)
        parse = parse_rocm_state
    else:
        return {"available": False, "reason": f"no GPU ({backend} backend)"}
    if tool.status != "ok":
        return {"available": False, "reason": f"{tool.tool}: {tool.reason}"}
    try:
        return {"available": True, **parse(tool.stdout)}
    except (ValueError, KeyError) as exc:
        return {"available": False, "reason": f"{tool.tool}: {exc}"}


def throttled(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Whether the GPU throttled during a cell: "yes: <reasons>", "no", or "unknown: <why>"."""
    if not (before.get("available") and after.get("available")):
        return "unknown: " + (before.get("reason") or after.get("reason") or "state not read")
    reasons = {r for state in (before, after) for r in (state.get("throttle") or "").split(",") if r}
    if reasons:
        return "yes: " + ",".join(sorted(reasons))
    if before.get("throttle") is None or after.get("throttle") is None:
        return "unknown: the tool reports no throttle reasons"
    return "no"


def state_text(state: dict[str, Any]) -> str:
    """Compact JSON of a state for a CSV cell."""
    return json.dumps(state, separators=(",", ":"), sort_keys=True)
