"""What the LLM rows record about the machine: peak memory of a test, the attention kernel SDPA picks, and
the study's AOTriton switch."""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AOTRITON_VARIABLE = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


def apply_aotriton_env(enabled: bool, environ: dict[str, str] | None = None) -> str:
    """Set the variable from config before torch starts (the study sets it to 1); return the value."""
    environ = os.environ if environ is None else environ
    environ[AOTRITON_VARIABLE] = "1" if enabled else "0"
    return environ[AOTRITON_VARIABLE]


class PeakMemory:
    """High-water marks of one test: the CUDA/HIP caching allocator, or the process RSS on CPU."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.counter = ("torch.cuda.max_memory_allocated / max_memory_reserved" if gpu
                        else "process peak RSS (VmHWM, reset per test)")

    def reset(self) -> None:
        import torch

        if self.gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets the peak RSS of this process
        except OSError:
            self.counter = "process peak RSS since start (VmHWM could not be reset)"

    def read(self) -> tuple[float, float]:
        import torch

        if self.gpu:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024 / 2**30
                    return peak, peak
        except OSError:
            pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        return peak, peak


def sdpa_kernel(q_shape: Sequence[int], kv_shape: Sequence[int], causal: bool, device: str, dtype: Any,
                masked: bool = False) -> str:
    """Which kernel ``scaled_dot_product_attention`` picks for these shapes (and a boolean key mask, if
    ``masked``), read off the profiler's op names."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(*q_shape, device=device, dtype=dtype, generator=gen)
    k = torch.randn(*kv_shape, device=device, dtype=dtype, generator=gen)
    mask = torch.ones(1, kv_shape[2], dtype=torch.bool, device=device) if masked else None
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            F.scaled_dot_product_attention(q, k, k, attn_mask=mask, is_causal=causal,
                                           enable_gqa=q_shape[1] != kv_shape[1])
    except Exception as exc:  # a probe failure is a recorded answer, not a crash
        return f"unknown ({type(exc).__name__})"
    seen = {e.name for e in prof.events()}
    found = [label for op, label in SDPA_OPS.items() if op in seen]
    return found[0] if found else "other"


def attention_kernels(config: Any, prompt_tokens: int, device: str, dtype: Any, cache_len: int | None = None) -> str:
    """Prefill and decode kernels SDPA picks for this model's shapes: transformers' sdpa path, or with
    ``cache_len`` engine fast's decode step (Triton's split-KV kernel on a GPU, else SDPA with a KV head's query
    heads as query rows over a masked static cache)."""
    import torch

    from gpulab.llm.qwen2 import split_kv_available

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    prefill = sdpa_kernel((1, heads, prompt_tokens, head_dim), (1, kv, prompt_tokens, head_dim), True, device, dtype)
    if cache_len is None:
        decode = sdpa_kernel((1, heads, 1, head_dim), (1, kv, prompt_tokens, head_dim), False, device, dtype)
        return f"prefill {prefill} / decode {decode}"
    if split_kv_available(torch.device(device), head_dim):
        return f"prefill {prefill} (SDPA) / decode Triton split-KV (flash-decoding, positions up to the current one)"
    decode = sdpa_kernel((1, kv, heads // kv, head_dim), (1, kv, cache_len, head_dim), False, device, dtype,
                         masked=True)
    return f"prefill {prefill} (SDPA) / decode {decode} (SDPA, masked fixed-length, compiled)"
