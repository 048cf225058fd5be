"""The study's LLM run: its prompt, its generation call, and the figures it reported.

Source: shared/study/rocm-intro-operator-optimisation.md, section "大模型 (LLM) 推理实战": Qwen2.5-7B-Instruct in
bf16, the chat template, ``generate(max_new_tokens=512, temperature=0.7, top_p=0.9)`` over the model's own
generation_config.json, tokens over seconds and the peak allocated memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

SYSTEM_PROMPT = "你是一个才华横溢的诗人。"
USER_PROMPT = "你好，请用这台高性能显卡为我写一首关于 AMD 显卡逆袭的七言绝句。"
MESSAGES = ({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER_PROMPT})

# What the study printed on its machine (the model's real weights, transformers' generate).
REPORTED = {
    "device": "AMD Radeon 8060S (62.5 GB, ROCm 7.1)",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "engine": "hf",
    "tok_s": 9.28,
    "peak_alloc_gib": 14.28,  # max_memory_allocated / 1024**3, printed as "GB"
    "load_s": 3.67,
    "response": "昔日显皇N独尊，今朝AMD起风云。\n\n Radeon力挽狂澜，性能超越旧王尊。",
}


@dataclass(frozen=True)
class Sampling:
    """Effective sampling of one generate call, in the order transformers applies it."""

    do_sample: bool
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    @classmethod
    def greedy(cls) -> Sampling:
        return cls(do_sample=False)

    @classmethod
    def study(cls, generation_config: Any, temperature: float, top_p: float) -> Sampling:
        """The study's arguments over the model's generation config, as ``generate`` merges them."""
        return cls(
            do_sample=bool(getattr(generation_config, "do_sample", False)),
            temperature=float(temperature),
            top_k=int(getattr(generation_config, "top_k", None) or 0),
            top_p=float(top_p),
            repetition_penalty=float(getattr(generation_config, "repetition_penalty", None) or 1.0),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def generate_kwargs(self) -> Mapping[str, Any]:
        """Keyword arguments that make ``generate`` use exactly this sampling, whatever the model's defaults."""
        if not self.do_sample:
            return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None,
                    "repetition_penalty": self.repetition_penalty}
        return {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k or None,
                "top_p": self.top_p, "repetition_penalty": self.repetition_penalty}
