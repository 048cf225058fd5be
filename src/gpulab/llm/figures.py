"""The timed figures, llama-bench's names: ``pp<N>`` (prefill, tokens/s), ``ttft<N>`` (time to the first
token), ``tg<N>`` (N forced tokens after a one-token prompt) and ``study`` (the study's prompt and call, one run).

Every time goes through :func:`gpulab.core.timing.measure`; decode rows get bytes per token, achieved GB/s and the
share of the read-only ceiling.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpulab.core.ceilings import Hit, above_ceiling, pct_of
from gpulab.core.datasheet import pct_of_datasheet
from gpulab.core.device import DeviceInfo
from gpulab.core.energy import ENERGY_SPAN_S, per_unit
from gpulab.core.timing import Timing, TimingSettings, measure
from gpulab.llm.engines import Engine
from gpulab.llm.probe import PeakMemory
from gpulab.llm.roofline import Ceiling, bytes_per_token
from gpulab.llm.study import Sampling

log = logging.getLogger(__name__)
STUDY_WARMUP_TOKENS = 8


def error_status(exc: BaseException) -> str:
    return "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower() else "failed"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def mean_sd_tok_s(tokens: int, timing: Timing) -> tuple[float, float]:
    tok_s = tokens / (timing.mean_ms / 1e3)
    return tok_s, tok_s * timing.cv if not math.isnan(timing.cv) else math.nan


@dataclass
class Bench:
    """What every figure of one engine needs: the engine, the model, the ceiling, the timing settings."""

    engine: Engine
    model: Any
    ceiling: Ceiling
    info: DeviceInfo
    reps: int
    memory: PeakMemory
    rows: list[dict[str, Any]] = field(default_factory=list)

    def settings(self, reps: int) -> TimingSettings:
        return TimingSettings(min_time_s=1e-9, min_reps=reps, max_reps=reps, warmup_reps=1, flush_cache=False,
                              energy_span_s=ENERGY_SPAN_S)

    def timed(self, test: str, fn: Callable[[], Any], reps: int, **values: Any) -> dict[str, Any] | None:
        """Measure ``fn`` with the test's peak memory; a failure becomes a row with its status and reason."""
        try:
            self.memory.reset()
            timing = measure(fn, self.settings(reps), self.info)
            alloc, reserved = self.memory.read()
        except Exception as exc:  # one failing test is a recorded outcome; the others still run
            log.error("%s %s failed:\n%s", self.engine.name, test, traceback.format_exc())
            self.rows.append({"test": test, "status": error_status(exc), "reason": first_line(exc), **values})
            return None
        row = {"test": test, "status": "ok", "reason": "", "peak_alloc_gib": alloc, "peak_reserved_gib": reserved,
               **values, **timing.as_row()}
        self.rows.append(row)
        log.info("%s %s: %.2f ms mean over %d", self.engine.name, test, timing.mean_ms, reps)
        return row

    def decode_bandwidth(self, row: dict[str, Any], mean_context: float) -> None:
        """Bytes a decode step reads, achieved GB/s and the share of the read-only ceiling."""
        row["bytes_per_token"] = bytes_per_token(self.model, mean_context)
        row["gbps"] = row["bytes_per_token"] * row["tok_s"] / 1e9
        row["gbps_all_weights"] = row["weight_bytes"] * row["tok_s"] / 1e9
        row["roofline_tok_s"] = self.ceiling.gbps * 1e9 / row["bytes_per_token"]
        row["pct_of_ceiling"] = pct_of(row["gbps"], self.ceiling.gbps)
        spread = row["p90_ms"] / row["p10_ms"] if row["p10_ms"] > 0 else 1.0
        row["above_ceiling"] = above_ceiling(row["gbps"], Hit(self.ceiling.gbps, math.nan, "", 1.0), spread)
        row["datasheet_gbps"], row["pct_of_datasheet"] = pct_of_datasheet(row["gbps"], self.info.name)

    def energy(self, row: dict[str, Any], tokens: int) -> None:
        """Joules per token and tokens per joule of the row's calls (unknown energy stays unknown)."""
        row["tok_per_j"] = per_unit(row["energy_j"], tokens)
        row["j_per_token"] = 1.0 / row["tok_per_j"] if row["tok_per_j"] > 0 else math.nan


def pp(bench: Bench, ids: torch.Tensor, weight_bytes: int) -> None:
    n = int(ids.shape[1])
    row = bench.timed(f"pp{n}", lambda: bench.engine.prefill(ids), bench.reps, n_prompt=n, n_gen=0,
                      weight_bytes=weight_bytes)
    if row:
        row["tok_s"], row["tok_s_sd"] = mean_sd_tok_s(n, _timing(row))
        bench.energy(row, n)


def ttft(bench: Bench, ids: torch.Tensor, weight_bytes: int) -> None:
    n = int(ids.shape[1])
    bench.timed(f"ttft{n}", lambda: bench.engine.first_token(ids), bench.reps, n_prompt=n, n_gen=1,
                weight_bytes=weight_bytes)


def tg(bench: Bench, ids: torch.Tensor, n: int, weight_bytes: int) -> None:
    def run() -> None:
        bench.engine.generate(ids, n, Sampling.greedy(), stop_at_eos=False)

    row = bench.timed(f"tg{n}", run, bench.reps, n_prompt=int(ids.shape[1]), n_gen=n, weight_bytes=weight_bytes)
    if row:
        row["tok_s"], row["tok_s_sd"] = mean_sd_tok_s(n, _timing(row))
        bench.energy(row, n)
        # step t (1..n) attends to the prompt and the t-1 tokens before it
        bench.decode_bandwidth(row, int(ids.shape[1]) + (n - 1) / 2)


def _timing(row: dict[str, Any]) -> Timing:
    return Timing(**{k: row[k] for k in Timing.__dataclass_fields__})


class StudyRun:
    """The study's generation as a closure for :func:`measure`: its untimed first call is a short warm-up
    (the same prompt and sampling, a few tokens; none with ``warm_up=False``), later calls the full run, whose
    output is kept."""

    def __init__(self, engine: Engine, ids: torch.Tensor, max_new_tokens: int, sampling: Sampling,
                 warm_up: bool = True) -> None:
        self.engine, self.ids, self.max_new_tokens, self.sampling = engine, ids, max_new_tokens, sampling
        self.calls = 0 if warm_up else 1
        self.output: list[int] = []

    def __call__(self) -> None:
        n = min(STUDY_WARMUP_TOKENS, self.max_new_tokens) if self.calls == 0 else self.max_new_tokens
        self.calls += 1
        self.output = self.engine.generate(self.ids, n, self.sampling, stop_at_eos=True)

    def made(self) -> int:
        """Tokens the last call made (it stops early at an end of sequence)."""
        return len(self.output)


def study(bench: Bench, ids: torch.Tensor, max_new_tokens: int, sampling: Sampling, seed: int,
          weight_bytes: int) -> list[int]:
    """The study's run, timed once; returns its tokens."""
    torch.manual_seed(seed)
    run = StudyRun(bench.engine, ids, max_new_tokens, sampling)
    row = bench.timed("study", run, 1, n_prompt=int(ids.shape[1]), n_gen=0, weight_bytes=weight_bytes)
    if row:
        row["n_gen"] = len(run.output)
        row["tok_s"], row["tok_s_sd"] = len(run.output) / (row["mean_ms"] / 1e3), math.nan  # one run, as the study
        bench.energy(row, len(run.output))
        bench.decode_bandwidth(row, int(ids.shape[1]) + (len(run.output) - 1) / 2)
    return run.output
