"""What a decode step must read, and the bandwidth it is placed against.

``bytes_per_token`` = all parameters less the input embedding table (one row of it a token; a table tied to the
lm_head stays), plus the KV cache at the test's mean context length. The ceiling is the measured read-only
bandwidth, else the copy ceiling, said so in ``ceiling_pattern``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READ = "read"


def weight_bytes(model: Any) -> int:
    """Bytes of all parameters (``parameters()`` yields a tied table once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_bytes_read(model: Any) -> int:
    """Bytes of the parameters a decode step reads: all but the input embedding table, unless it is tied
    to the lm_head (then the head reads it whole)."""
    embed = model.get_input_embeddings().weight
    tied = embed.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    return weight_bytes(model) - (0 if tied else embed.numel() * embed.element_size())


def kv_bytes_per_position(config: Any, itemsize: int) -> int:
    """K and V of one position in every layer."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize


def bytes_per_token(model: Any, mean_context: float) -> int:
    itemsize = model.lm_head.weight.element_size()
    return int(weight_bytes_read(model) + kv_bytes_per_position(model.config, itemsize) * mean_context)


@dataclass(frozen=True)
class Ceiling:
    gbps: float
    pattern: str  # read, or what stood in for it and why


def read_ceiling(path: str | Path | None, dtype: str) -> Ceiling:
    """The read-only bandwidth of ``dtype`` at the largest measured size; the copy ceiling if absent."""
    if not path:
        return Ceiling(math.nan, "none (no ceilings given)")
    from gpulab.core.ceilings import Ceilings

    ceilings = Ceilings.load(path)
    read = ceilings.read_gbps(dtype)
    if not math.isnan(read):
        return Ceiling(read, READ)
    return Ceiling(ceilings.copy_gbps(dtype), "copy (ceilings.csv has no read-only row)")
