"""Rule ``tune_fast``: engine fast's decode speed under named variants of its compilation and device graphs.

Each variant (a :class:`~gpulab.llm.graphs.GraphSettings`) builds engine fast over the same weights and runs the
step's ``tg`` figure; its greedy tokens are compared with the default variant's (``tokens_match_default``). Variants
that need graphs are skipped without a GPU; one that fell back to eager steps is ``failed``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from gpulab.core.device import DeviceInfo, detect
from gpulab.core.tables import Column, TableSchema
from gpulab.llm import bench, figures
from gpulab.llm.bench import LLM, Job, Sizes
from gpulab.llm.engines import FastEngine
from gpulab.llm.graphs import GraphSettings
from gpulab.llm.models import ResolvedModel
from gpulab.llm.probe import PeakMemory
from gpulab.llm.roofline import Ceiling
from gpulab.llm.study import Sampling

log = logging.getLogger(__name__)

DECODE_TOKENS = 32
VARIANTS: dict[str, GraphSettings] = {
    "eager": GraphSettings(compile=False, graphs=False),
    "compile": GraphSettings(compile=True, graphs=False),
    "graphs": GraphSettings(compile=False, graphs=True),
    "compile_graphs": GraphSettings(compile=True, graphs=True),
    "compile_graphs_coordinate_descent": GraphSettings(
        compile=True, graphs=True, inductor_options=(("coordinate_descent_tuning", True),)),
    "compile_graphs_max_autotune": GraphSettings(compile=True, graphs=True,
                                                 compile_mode="max-autotune-no-cudagraphs"),
}
_LLM_COLUMNS = {c.name: c for c in LLM.columns}

TUNE_FAST = TableSchema(
    "tune_fast",
    (
        *(_LLM_COLUMNS[n] for n in ("model", "model_source")),
        Column("variant", "str", " | ".join(VARIANTS) + " (gpulab.llm.tune.VARIANTS)"),
        Column("default", "bool", "the variant the workflow's engine fast runs (llm.compile, llm.graphs)"),
        Column("settings", "str", "torch.compile, device graphs, Inductor mode or options of the variant"),
        *(_LLM_COLUMNS[n] for n in ("graph_mode", "test", "dtype", "device", "n_prompt", "n_gen", "tok_s",
                                    "tok_s_sd", "peak_alloc_gib", "peak_reserved_gib", "weight_bytes",
                                    "bytes_per_token", "gbps", "gbps_all_weights", "ceiling_gbps", "ceiling_pattern",
                                    "roofline_tok_s", "pct_of_ceiling", "above_ceiling", "datasheet_gbps",
                                    "pct_of_datasheet", "j_per_token", "tok_per_j")),
        Column("prepare_s", "float", "compilation and capture before the first timed step, s"),
        Column("tokens_match_default", "bool", "the variant's greedy tokens on the study's prompt equal the default "
               "variant's"),
        Column("first_mismatch", "int", "index of the first token that differs from the default variant's"),
        _LLM_COLUMNS["seed"],
    ),
    measured=True,
    path="tune/fast.csv",
)


def describe(settings: GraphSettings) -> str:
    parts = [f"compile={'on' if settings.compile else 'off'}", f"graphs={'on' if settings.graphs else 'off'}"]
    if settings.compile_mode:
        parts.append(f"mode={settings.compile_mode}")
    parts += [f"{k}={v}" for k, v in settings.inductor_options]
    return " ".join(parts)


def default_variant(cfg: Mapping[str, Any], gpu: bool) -> str:
    resolved = GraphSettings.resolve(dict(cfg), gpu)
    return next(name for name, settings in VARIANTS.items() if settings == resolved)


def against(tokens: Sequence[int] | None, reference: Sequence[int] | None) -> dict[str, Any]:
    """Whether ``tokens`` equal the default variant's, and where they first differ."""
    if tokens is None or reference is None:
        return {}
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b), None)
    if first is None and len(tokens) != len(reference):
        first = min(len(tokens), len(reference))
    return {"tokens_match_default": first is None, "first_mismatch": first}


def _free(device: str) -> None:
    # Each variant compiles the same decode function afresh with its own options, and holds its own fused
    # weights, cache and graphs: nothing of the previous variant may stay.
    torch.compiler.reset()
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


def run_variant(settings: GraphSettings, loaded: Any, job: Job, prompts: dict[str, Any], tokens: int
                ) -> tuple[dict[str, Any], list[int] | None]:
    """One variant's tg row and its greedy tokens on the study's prompt (None when it did not run)."""
    if settings.graphs and not job.info.gpu_available:
        return {"status": "skipped", "reason": f"device graphs need a GPU ({job.info.reason})"}, None
    chat = prompts["chat"]
    capacity = max(job.sizes.kv_capacity(int(chat.shape[1])), -(-(int(chat.shape[1]) + tokens + 2) // 64) * 64)
    _free(job.info.torch_device)
    try:
        engine = FastEngine(loaded, capacity, dict(job.cfg), Sampling.greedy(), [], settings=settings)
        measured = figures.Bench(engine, loaded.model, job.ceiling, job.info, job.sizes.reps,
                                 PeakMemory(job.info.gpu_available))
        figures.tg(measured, prompts["tg"], tokens, loaded.weight_bytes)
        greedy = engine.generate(chat, tokens, Sampling.greedy(), stop_at_eos=False)
    except Exception as exc:  # one variant failing must not hide the others
        log.exception("variant %s failed", describe(settings))
        return {"status": figures.error_status(exc), "reason": figures.first_line(exc)}, None
    row = {**measured.rows[0], "graph_mode": engine.graph_mode, "prepare_s": engine.prepare_s}
    note = engine.decoder.graphs.note
    if note and row["status"] == "ok":
        row.update(status="failed", reason=f"ran eager steps, not the variant: {note}")
    return row, greedy


def tune_model(resolved: ResolvedModel, cfg: Mapping[str, Any], *, target: str, fingerprint: str, ceiling: Ceiling,
               variants: Iterable[str] = VARIANTS, tokens: int = DECODE_TOKENS,
               info: DeviceInfo | None = None) -> list[dict[str, Any]]:
    """Every variant's row for one model, the default variant first (its tokens are the reference)."""
    info = info or detect()
    base = {"target": target, "fingerprint": fingerprint, "model": resolved.spec, "model_source": resolved.source,
            "dtype": str(cfg["dtype"]), "device": info.name, "seed": int(cfg["seed"]),
            "ceiling_gbps": ceiling.gbps, "ceiling_pattern": ceiling.pattern}
    job = Job(resolved, cfg, Sizes.resolve(cfg, info.gpu_available), info, base, ceiling)
    default = default_variant(cfg, info.gpu_available)
    names = [default, *(n for n in variants if n != default)]
    loaded, problem = bench.load(job)
    if problem:
        return [{**base, "variant": n, "default": n == default, "settings": describe(VARIANTS[n]),
                 "status": problem[0], "reason": problem[1]} for n in names]
    prompts = bench.prompts_of(loaded, job)
    rows, reference = [], None
    for name in names:
        row, greedy = run_variant(VARIANTS[name], loaded, job, prompts, tokens)
        reference = greedy if name == default else reference
        rows.append({**base, "variant": name, "default": name == default, "settings": describe(VARIANTS[name]),
                     **row, **against(greedy, reference)})
        log.info("%s %s: %s %s", resolved.spec, name, row["status"],
                 f"{row['tok_s']:.4g} tok/s" if row["status"] == "ok" else row["reason"])
    return rows


def tune_fast_job(model_files: Iterable[str], cfg: Mapping[str, Any], *, target: str, fingerprint: str,
                  ceilings_path: str, out_path: str) -> Any:
    """What the Snakemake job of one target does: every model of ``llm.models``, every variant, one table."""
    from gpulab.llm.roofline import read_ceiling

    ceiling = read_ceiling(ceilings_path, str(cfg["dtype"]))
    rows = [row for path in model_files for row in tune_model(ResolvedModel.read(path), cfg, target=target,
                                                              fingerprint=fingerprint, ceiling=ceiling)]
    return TUNE_FAST.write(rows, out_path)
