"""Next-token choice on the device, with no host synchronisation (it runs inside captured device graphs).

The processors are transformers' own, in its order (repetition penalty, temperature, top-k, top-p), on
float32 logits as ``generate`` uses them. The draw uses the exponential trick (argmax of p / E with E ~
Exp(1) is a sample from p) instead of ``torch.multinomial``, so no host round trip is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpulab.llm.study import Sampling

TOP_K_BLOCK = 1024


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk`` of a 1-D tensor in two stages (per block of 1024, then over the block winners).

    Blocks of 1024 give the device many independent rows to work on instead of one very long one. The result
    is the same values in the same (descending) order.
    """
    n = scores.shape[-1]
    if n <= TOP_K_BLOCK * 4 or k > TOP_K_BLOCK:
        return torch.topk(scores, k)
    blocks = -(-n // TOP_K_BLOCK)
    padded = F.pad(scores, (0, blocks * TOP_K_BLOCK - n), value=float("-inf")).view(blocks, TOP_K_BLOCK)
    block_values, block_indices = torch.topk(padded, k, dim=-1)
    offsets = torch.arange(blocks, device=scores.device).unsqueeze(1) * TOP_K_BLOCK
    values, winners = torch.topk(block_values.flatten(), k)
    return values, (block_indices + offsets).flatten().gather(0, winners)


def next_token(logits: torch.Tensor, presence: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """One token id (shape ``(1,)``, int64) from ``logits`` (``(1, vocab)`` float32).

    ``presence`` (``(vocab,)`` bool) marks the ids in the prompt and the output so far, for the
    repetition penalty.
    """
    scores = logits[0]
    if sampling.repetition_penalty != 1.0:
        penalty = sampling.repetition_penalty
        scores = torch.where(presence, torch.where(scores < 0, scores * penalty, scores / penalty), scores)
    if not sampling.do_sample:
        return scores.argmax(-1, keepdim=True)
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    if sampling.top_k:
        values, indices = top_k(scores, min(sampling.top_k, scores.shape[-1]))
    else:
        values, indices = torch.sort(scores, descending=True)
    probs = torch.softmax(values, dim=-1)
    if sampling.top_p < 1.0:
        # transformers removes a token when the mass of the tokens ranked below it (itself included) is at
        # most 1 - top_p, i.e. when the mass strictly above it is at least top_p; the top token always stays.
        above = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(above >= sampling.top_p, 0.0)
    draw = torch.empty_like(probs).exponential_(1.0)
    return indices.gather(-1, (probs / draw).argmax(-1, keepdim=True))
