"""Pre-flight: settings whose tensors or run time cannot fit the device fail before any job starts, with
estimate and limit.

Each estimate is a lower bound of one step's peak memory (an LLM's: its weights) from the explicit settings (the
``auto`` values scale with the device and fit by construction; where one setting of a step is explicit, its
``auto`` partners count at their GPU values). The limit is the memory the measuring device has: the local
GPU's (``nvidia-smi`` / ``rocm-smi``), the host's without a GPU driver, and for cluster targets, whose nodes this
host cannot see, :data:`LARGEST_DEVICE_BYTES`.

Time is checked where a job has a time limit: a cluster target's ``runtime_min`` (or a rule's ``runtime`` set
on the command line or in the profile's ``set-resources``). Each estimate is a lower bound of one job's wall
time: work the settings fix (bytes every decode step reads, an MLP's FLOPs, a cell's least span) at rates no
accelerator reaches (:data:`FASTEST_BYTES_PER_S`, :data:`FASTEST_FLOP_PER_S`), so a check that fails is sure to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulab.workflow.config import ConfigError

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
# Above any accelerator memory today (8 TB/s: NVIDIA B200 and B300, AMD MI355X): time bounds stay lower bounds.
FASTEST_BYTES_PER_S = 10e12
# Twice the fastest dense bf16 matmul rate of an accelerator today (about 2.5 PFLOP/s).
FASTEST_FLOP_PER_S = 5e15
# Forward and backward FLOPs of a linear layer per weight and batch row.
TRAIN_FLOPS_PER_WEIGHT = 6
# MLP variants every backend runs (TF32 is CUDA's, graph replay a GPU's): only they count toward a time bound.
MLP_EVERYWHERE = {"fp32", "bf16", "bf16_weights"}


class PreflightError(ConfigError):
    """Some setting needs more memory than the device has, or more time than a job may take."""


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
    from gpulab.core.device import gpu_driver_present

    if config.get("targets"):
        return LARGEST_DEVICE_BYTES, "the largest accelerator memory there is: cluster targets' nodes are not " \
                                     "visible from here"
    if gpu_driver_present():
        gpu = _gpu_memory()
        if gpu:
            return gpu, "this machine's GPU memory"
        return LARGEST_DEVICE_BYTES, "the largest accelerator memory there is: no vendor tool reports this GPU's"
    return host_memory(), "this machine's memory: without a GPU driver the steps measure the CPU"


def memory_problems(config: Mapping[str, Any], limit: tuple[int, str] | None = None) -> list[str]:
    """A line per setting whose memory estimate exceeds the device's memory."""
    found = estimates(config)
    if not found:
        return []
    limit_bytes, limit_what = limit or device_limit(config)
    return [f"{what} needs at least {n / GIB:,.1f} GiB; the limit is {limit_bytes / GIB:,.1f} GiB, {limit_what}"
            for n, what in found if n > limit_bytes]


def bench_seconds(config: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """A benchmark cell spreads its cases' blocks over at least ``timing.min_span_s``."""
    span = (config.get("timing") or {}).get("min_span_s", "auto")
    if span == "auto":
        return []
    return [(float(span), "bench_cell", f"every benchmark cell (timing.min_span_s {float(span):,.0f} s)")]


def mlp_seconds(config: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """The training steps (the profiler window, the warm-up and the timed repetitions) of each variant that runs
    on every backend, at the fastest matmul rate there is."""
    mlp, timing = config.get("mlp") or {}, config.get("timing") or {}
    if all(mlp.get(k, "auto") == "auto" for k in MLP_AUTO):
        return []
    dim, layers, batch = (_explicit(mlp, k, v) for k, v in MLP_AUTO.items())
    steps = int(mlp.get("num_steps", 5)) + int(timing.get("warmup_reps", 3)) + int(timing.get("min_reps", 10))
    variants = len(set(mlp.get("variants") or []) & MLP_EVERYWHERE) or 1
    flops = variants * steps * TRAIN_FLOPS_PER_WEIGHT * layers * dim * dim * batch
    return [(flops / FASTEST_FLOP_PER_S, "mlp_profile",
             f"mlp ({variants} variants x {steps} steps of {TRAIN_FLOPS_PER_WEIGHT} x {layers:,} x {dim:,}^2 x "
             f"{batch:,} FLOPs at {FASTEST_FLOP_PER_S / 1e15:,.0f} PFLOP/s)")]


def llm_seconds(config: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """Each model's forced-length decode (the tg figure's timed repetitions, every engine), each step reading
    every weight once at the fastest memory there is."""
    llm = config.get("llm") or {}
    engines = len(llm.get("engines") or [None])
    tokens = engines * int(llm.get("reps", 3)) * _explicit(llm, "gen_tokens", 128)
    plural = "s" * (engines != 1)
    found = []
    for weight_bytes, what in llm_bytes(llm):
        seconds = tokens * weight_bytes / FASTEST_BYTES_PER_S
        found.append((seconds, "llm_infer", f"{what.split(' (')[0]} ({tokens:,} decode steps over {engines} "
                                            f"engine{plural}, each reading {weight_bytes / 1e9:,.1f} GB at "
                                            f"{FASTEST_BYTES_PER_S / 1e12:,.0f} TB/s)"))
    return found


def time_estimates(config: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    """(seconds, rule, what): lower bounds of one job's wall time from the settings."""
    return bench_seconds(config) + mlp_seconds(config) + llm_seconds(config)


def runtime_overrides(overwrite_resources: Mapping[str, Mapping[str, Any]] | None) -> dict[str, float]:
    """Rules' ``runtime`` (minutes) set on the command line or in a profile's ``set-resources``; values that are
    not plain numbers (an expression, a duration Snakemake left as text) are left out."""
    found = {}
    for rule, resources in (overwrite_resources or {}).items():
        value = getattr(resources.get("runtime"), "value", resources.get("runtime"))
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[rule] = float(value)
    return found


def time_problems(config: Mapping[str, Any], overrides: Mapping[str, float] | None = None) -> list[str]:
    """A line per job whose least time exceeds its time limit: the shortest ``runtime_min`` of the targets,
    unless the rule's own ``runtime`` is set. Without targets a local run has no time limit."""
    targets = config.get("targets") or {}
    if not targets:
        return []
    name, spec = min(targets.items(), key=lambda item: int(item[1]["runtime_min"]))
    default = float(spec["runtime_min"]), f"targets.{name}.runtime_min"
    overrides = overrides or {}
    problems = []
    for seconds, rule, what in time_estimates(config):
        minutes, source = (overrides[rule], f"the runtime set for rule {rule}") if rule in overrides else default
        if seconds > minutes * 60:
            problems.append(f"{rule}: {what} needs at least {seconds / 60:,.1f} min; the limit is {minutes:,.0f} "
                            f"min, {source}")
    return problems


def check(config: Mapping[str, Any], limit: tuple[int, str] | None = None,
          runtime: Mapping[str, float] | None = None) -> None:
    """Raise :class:`PreflightError` listing every setting whose memory estimate exceeds the device's memory,
    and every job whose least time exceeds its time limit (``runtime``: rules' own limits, in minutes)."""
    problems = memory_problems(config, limit) + time_problems(config, runtime)
    if problems:
        lines = "\n".join(f"  - {line}" for line in problems)
        raise PreflightError(f"settings that cannot fit the device ({len(problems)}), found before any job "
                             f"started:\n{lines}")
