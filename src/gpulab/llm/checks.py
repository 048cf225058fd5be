"""Correctness of the fast engines against transformers, before any of their times is trusted.

``greedy<N>`` (``fast_exact``): its first N greedy tokens equal ``generate``'s. ``teacher<N>`` (``fast``,
``hf_compiled``): teacher-forced logits within a bound of transformers' (``llm.teacher_tolerance``, or a multiple of
transformers' disagreement with itself) and the same greedy token wherever rounding cannot swap the top two. A
failure names the worst position; the method is in docs/methodology/correctness.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gpulab.llm.study import Sampling

if TYPE_CHECKING:
    from gpulab.llm.engines import Engine, HfEngine

# How many times transformers' own rounding noise the engine may differ from it (see the module docstring).
NOISE_MULTIPLIER = 2.0


class TeacherForced(Protocol):
    """An engine that runs a sequence under teacher forcing (``fast``, ``hf_compiled``)."""

    def teacher(self, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class Check:
    test: str
    ok: bool
    reason: str
    values: dict[str, Any]


def greedy_identity(engine: Engine, hf: HfEngine, ids: torch.Tensor, n: int) -> tuple[Check, dict[str, Any]]:
    """The engine's greedy tokens against ``generate``'s; the texts for the JSON file."""
    reference = hf.generate(ids, n, Sampling.greedy(), stop_at_eos=False)
    tokens = engine.generate(ids, n, Sampling.greedy(), stop_at_eos=False)
    differ = [i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b]
    first = differ[0] if differ else None
    reason = ""
    if differ:
        reason = (f"greedy tokens differ from hf at token {first} ({engine.name} {tokens[first]} vs hf "
                  f"{reference[first]}; {_reference_margin(hf, ids, reference[:first])}); times not trusted")
    values = {"n_prompt": int(ids.shape[1]), "n_gen": n, "tokens_match": not differ, "first_mismatch": first}
    texts = {"prompt_tokens": int(ids.shape[1]), "tokens": tokens, "hf_tokens": reference}
    return Check(f"greedy{n}", not differ, reason, values), texts


def _reference_margin(hf: HfEngine, prompt_ids: torch.Tensor, prefix: list[int]) -> str:
    """How close transformers' own choice was at a mismatch: its top-2 logit gap against bf16's spacing."""
    ids = torch.cat([prompt_ids, prompt_ids.new_tensor([prefix])], dim=1) if prefix else prompt_ids
    top = hf.logits(ids[0])[-1].topk(2).values
    spacing = 2.0 ** (math.floor(math.log2(abs(float(top[0])) or 1.0)) - 7)
    return f"hf's top-2 logit gap there {float(top[0] - top[1]):.4g}, bf16 spacing {spacing:.4g}"


def error_bound(tolerance: float, ref_self_err: float = 0.0) -> float:
    """The largest ‖Δ‖/‖ref‖ allowed: the tolerance, or twice the reference's own rounding noise if larger."""
    return max(tolerance, NOISE_MULTIPLIER * ref_self_err)


def compare_logits(logits: torch.Tensor, chosen: torch.Tensor, reference: torch.Tensor, tolerance: float,
                   ref_self_err: float = 0.0, first: int = 0) -> tuple[bool, str, dict[str, Any]]:
    """Teacher-forcing verdict from the engine's logits and choices against the reference logits (T, V), their
    first row the sequence's position ``first`` (the positions named are the sequence's)."""
    delta = logits.float() - reference.float()
    rel = (delta.norm(dim=-1) / reference.norm(dim=-1)).double()
    worst = first + int(rel.argmax())
    top = reference.topk(2, dim=-1).values
    decisive = (top[:, 0] - top[:, 1]) > 2 * delta.abs().amax(dim=-1)
    wrong = [first + p for p in (decisive & (chosen != reference.argmax(-1))).nonzero().flatten().tolist()]
    values = {"logit_rel_err": float(rel.max()), "worst_position": worst, "tokens_match": not wrong,
              "first_mismatch": wrong[0] if wrong else None, "n_gen": int(reference.shape[0])}
    bound = error_bound(tolerance, ref_self_err)
    if float(rel.max()) > bound:
        return False, (f"teacher forcing: logits at position {worst} differ from transformers' by "
                       f"‖Δ‖/‖ref‖ = {float(rel.max()):.3g} > {bound:.3g} (the larger of the tolerance {tolerance:g} "
                       f"and {NOISE_MULTIPLIER:g}x transformers against itself, {ref_self_err:.3g}); "
                       f"times not trusted"), values
    if wrong:
        p = wrong[0]
        return False, (f"teacher forcing: greedy token at position {p} is {int(chosen[p - first])}, transformers' "
                       f"{int(reference[p - first].argmax())}, with a top-2 gap beyond the logit error; times not "
                       "trusted"), values
    return True, "", values


def teacher_forcing(engine: TeacherForced, hf: HfEngine, ids: torch.Tensor, tolerance: float) -> Check:
    """Teacher forcing of the 1-D sequence ``ids``: half prefill, half decode steps, the engine's rows its last
    positions. The row also carries transformers' disagreement with itself (its incremental run against one
    forward pass): the rounding noise floor of this model, which random weights amplify."""
    split = max(1, int(ids.numel()) // 2)
    reference = hf.logits(ids, split).cpu()
    full = hf.logits(ids).cpu()
    self_err = float(((reference - full).norm(dim=-1) / full.norm(dim=-1)).max())
    logits, chosen = engine.teacher(ids, split)
    first = int(ids.numel()) - int(logits.shape[0])
    ok, reason, values = compare_logits(logits, chosen, reference[first:], tolerance, self_err, first)
    return Check(f"teacher{int(ids.numel())}", ok, reason, {**values, "ref_self_err": self_err})
