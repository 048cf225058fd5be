"""Pre-flight: settings whose tensors cannot fit the device fail before any job starts, with estimate and limit.

Each estimate is a lower bound of one step's peak memory (an LLM's: its weights) from the explicit settings (the
``auto`` values scale with the device and fit by construction; where one setting of a step is explicit, its
``auto`` partners count at their GPU values). The limit is the memory the measuring device has: the local
GPU's (``nvidia-smi`` / ``rocm-smi``), the host's without a GPU driver, and for cluster targets, whose nodes this
host cannot see, :data:`LARGEST_DEVICE_BYTES`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulab.config import ConfigError

GIB = 2**30
MIB = 2**20
# The most memory one accelerator offers today (AMD MI355X, NVIDIA B300: 288 GB), for devices not visible here.
LARGEST_DEVICE_BYTES = 288 * 10**9
# The auto values on a GPU (gpulab.mlp.model.resolve_shape), the largest auto picks.
MLP_AUTO = {"dim": 2048, "num_layers": 64, "batch": 1024}
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Tensors a benchmark case holds at once: inputs and output.
OP_TENSORS = {"gelu": 2, "softmax": 2, "add": 3}
FP64 = 8  # the correctness check's float64 reference


class PreflightError(ConfigError):
    """Some setting needs more memory than the device has."""


def _explicit(section: Mapping[str, Any], key: str, auto: int) -> int:
    value = section.get(key, "auto")
    return auto if value == "auto" else int(value)


def mlp_bytes(mlp: Mapping[str, Any]) -> tuple[int, str] | None:
    """Weights and their gradients (fp32) plus each layer's saved activations for backward, for explicit shapes."""
    if all(mlp.get(k, "auto") == "auto" for k in MLP_AUTO):
        return None
    dim, layers, batch = (_explicit(mlp, k, v) for k, v in MLP_AUTO.items())
    params = layers * (dim * dim + dim)
    total = 4 * (2 * params + 2 * batch * dim * layers)
    return total, f"mlp (dim {dim:,} x num_layers {layers:,} x batch {batch:,}: {params:,} parameters)"


def bench_bytes(bench: Mapping[str, Any]) -> list[tuple[int, str]]:
    """The largest explicit case of each op: its tensors in the widest dtype plus the float64 reference."""
    sizes = bench.get("sizes", "auto")
    widest = max(DTYPE_BYTES[d] for d in bench.get("dtypes", ["fp32"]))
    found = []
    if isinstance(sizes, Mapping):
        for op, cases in sizes.items():
            numels = [c[0] * c[1] if isinstance(c, list) else int(c) for c in cases]
            numel = max(numels)
            tensors = OP_TENSORS.get(op, 3)
            found.append((numel * tensors * (widest + FP64), f"bench {op} ({numel:,} elements, {tensors} tensors)"))
    mib = bench.get("max_tensor_mib", "auto")
    if mib != "auto":
        found.append((int(mib) * MIB * 3 * (1 + FP64 // 4), f"bench max_tensor_mib ({int(mib):,} MiB tensors)"))
    return found


def ceilings_bytes(ceilings: Mapping[str, Any]) -> list[tuple[int, str]]:
    found = []
    if ceilings.get("copy_mib", "auto") != "auto":
        mib = int(ceilings["copy_mib"])
        found.append((2 * mib * MIB, f"ceilings copy_mib ({mib:,} MiB source and destination)"))
    if ceilings.get("matmul_n", "auto") != "auto":
        n = int(ceilings["matmul_n"])
        found.append((3 * n * n * 4, f"ceilings matmul_n ({n:,} x {n:,}, three fp32 matrices)"))
    return found


def standalone_bytes(build: Mapping[str, Any]) -> list[tuple[int, str]]:
    sizes = build.get("standalone_sizes") or []
    if not sizes:
        return []
    n = max(int(s) for s in sizes)
    return [(2 * n * 4, f"build standalone_sizes ({n:,} fp32 elements in and out)")]


def transformer_parameters(arch: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only transformer (Qwen2, Llama) from its config.json: embeddings, attention with
    grouped key/value heads, a gated MLP per layer."""
    hidden, layers = int(arch["hidden_size"]), int(arch["num_hidden_layers"])
    heads = int(arch["num_attention_heads"])
    kv = int(arch.get("num_key_value_heads", heads)) * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * int(arch["intermediate_size"])
    embeddings = int(arch["vocab_size"]) * hidden * (1 if arch.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings


def llm_bytes(llm: Mapping[str, Any]) -> list[tuple[int, str]]:
    """Each configured model's weights in ``llm.dtype``, where its architecture is known here (a shipped
    config.json or a local directory's)."""
    from gpulab.llm.models import is_directory_spec, shipped_config_dir, spec_model_id

    found = []
    for spec in llm.get("models") or []:
        if spec == "tiny":
            continue
        directory = Path(spec).expanduser() if is_directory_spec(spec) else shipped_config_dir(spec_model_id(spec))
        try:
            arch = json.loads((directory / "config.json").read_text()) if directory else None
            params = transformer_parameters(arch) if isinstance(arch, dict) else None
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            params = None
        if params:
            dtype = llm.get("dtype", "bf16")
            found.append((params * DTYPE_BYTES[dtype], f"llm {spec} ({params / 1e9:,.1f} B parameters in {dtype})"))
    return found


def estimates(config: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(bytes, what) of every step's explicit settings."""
    found = []
    mlp = mlp_bytes(config.get("mlp") or {})
    if mlp:
        found.append(mlp)
    found += bench_bytes(config.get("bench") or {})
    found += ceilings_bytes(config.get("ceilings") or {})
    found += standalone_bytes(config.get("build") or {})
    found += llm_bytes(config.get("llm") or {})
    return found


def _gpu_memory(timeout_s: float = 20) -> int | None:
    """The local GPUs' smallest memory, from the vendor tool; None where no tool answers."""
    commands = [["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                ["rocm-smi", "--showmeminfo", "vram", "--json"]]
    for command in commands:
        if not shutil.which(command[0]):
            continue
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if command[0] == "nvidia-smi":
            values = [int(v) * MIB for v in out.split() if v.strip().isdigit()]
        else:
            try:
                cards = json.loads(out or "{}")
            except json.JSONDecodeError:
                continue
            values = [int(v) for card in cards.values() if isinstance(card, dict)
                      for k, v in card.items() if "Total Memory" in k and str(v).isdigit()]
        if values:
            return min(values)
    return None


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_limit(config: Mapping[str, Any]) -> tuple[int, str]:
    """(bytes, what) of the memory the measuring device has."""
    from gpulab.device import gpu_driver_present

    if config.get("targets"):
        return LARGEST_DEVICE_BYTES, "the largest accelerator memory there is: cluster targets' nodes are not " \
                                     "visible from here"
    if gpu_driver_present():
        gpu = _gpu_memory()
        if gpu:
            return gpu, "this machine's GPU memory"
        return LARGEST_DEVICE_BYTES, "the largest accelerator memory there is: no vendor tool reports this GPU's"
    return host_memory(), "this machine's memory: without a GPU driver the steps measure the CPU"


def check(config: Mapping[str, Any], limit: tuple[int, str] | None = None) -> None:
    """Raise :class:`PreflightError` listing every setting whose estimate exceeds the device's memory."""
    found = estimates(config)
    if not found:
        return
    limit_bytes, limit_what = limit or device_limit(config)
    over = [(n, what) for n, what in found if n > limit_bytes]
    if over:
        lines = "\n".join(f"  - {what} needs at least {n / GIB:,.1f} GiB; the limit is {limit_bytes / GIB:,.1f} GiB, "
                          f"{limit_what}" for n, what in over)
        raise PreflightError(f"settings that cannot fit the device ({len(over)}), found before any job started:\n"
                             f"{lines}")
