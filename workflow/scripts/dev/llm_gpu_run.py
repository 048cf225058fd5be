"""One GPU session for the LLM step (no Snakemake there): the workflow's measurement code on the Qwen2.5-7B
architecture with random bf16 weights, then decode-step timings of engine fast's variants on the same weights.

    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 workflow/scripts/dev/llm_gpu_run.py OUT ENGINES [KEY=JSON ...]

ENGINES is a comma list (hf,fast). Writes OUT/ceilings.csv, OUT/<model>__<engine>.csv/.json and
OUT/variants.json; prints the rows and the variant table last. Without a GPU it runs the tiny model (a smoke
test of the same code).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from gpulab.llm.bench import HfEngine, apply_aotriton_env, llm_defaults, run_llm

out = Path(sys.argv[1])
engines = sys.argv[2].split(",")
overrides = {k: json.loads(v) for k, _, v in (a.partition("=") for a in sys.argv[3:])}
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout,
                    force=True)
cfg = {**llm_defaults(), **overrides}
apply_aotriton_env(bool(cfg["aotriton_experimental"]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from gpulab.ceilings import CEILINGS, Ceilings, measure_ceilings  # noqa: E402
from gpulab.device import detect  # noqa: E402
from gpulab.llm.fast import FastOptions, FastQwen2  # noqa: E402
from gpulab.llm.models import load_model, resolve_model  # noqa: E402
from gpulab.llm.sampling import next_token, top_k  # noqa: E402
from gpulab.llm.study import MESSAGES, Sampling  # noqa: E402
from gpulab.llm.tiny import build_tiny  # noqa: E402
from gpulab.timing import TimingSettings, measure  # noqa: E402

start = time.perf_counter()
info = detect()
gpu = info.gpu_available
spec = "random:Qwen/Qwen2.5-7B-Instruct" if gpu else "tiny"
out.mkdir(parents=True, exist_ok=True)
tiny = build_tiny(Path(tempfile.mkdtemp()) / "tiny", seed=int(cfg["seed"]))
ceilings = measure_ceilings({"dtypes": [cfg["dtype"]], "matmul_n": 1024 if gpu else 128}, TimingSettings(),
                            target="gpu-session", fingerprint="unrecorded")
CEILINGS.write(ceilings, out / "ceilings.csv")
copy_gbps = Ceilings.load(out / "ceilings.csv").copy_gbps(cfg["dtype"])
print(f"[{time.perf_counter() - start:.0f} s] {info.name}: {cfg['dtype']} copy {copy_gbps:.0f} GB/s", flush=True)

resolved = resolve_model(spec, cfg, tiny_dir=tiny)
loaded = load_model(resolved, info.torch_device, cfg["dtype"], int(cfg["seed"]))
model, tokenizer = loaded.model, loaded.tokenizer
roofline = copy_gbps * 1e9 / loaded.weight_bytes
print(f"[{time.perf_counter() - start:.0f} s] {spec} loaded in {loaded.load_s:.1f} s "
      f"({loaded.weight_bytes / 1e9:.2f} GB); roofline {roofline:.1f} tok/s", flush=True)


def sync() -> None:
    if gpu:
        torch.cuda.synchronize()


# Sampling: one top-20 over the whole vocabulary, and the study's full token choice.
variants: dict = {"sampling": {}}
logits = torch.randn(1, model.lm_head.weight.shape[0], device=info.torch_device)
presence = torch.zeros(logits.shape[1], dtype=torch.bool, device=info.torch_device)
study = Sampling.study(model.generation_config, cfg["temperature"], cfg["top_p"])
few = TimingSettings(min_time_s=0.05, min_reps=20, max_reps=200, warmup_reps=3, flush_cache=False)
for label, fn in (("torch.topk", lambda: torch.topk(logits[0], 20)), ("two-stage top_k", lambda: top_k(logits[0], 20)),
                  ("torch.sort", lambda: torch.sort(logits[0])), ("next_token study", lambda: next_token(
                      logits, presence, study)), ("next_token greedy", lambda: next_token(logits, presence,
                                                                                          Sampling.greedy()))):
    variants["sampling"][label] = measure(fn, few, info).median_ms
print(f"[{time.perf_counter() - start:.0f} s] sampling ms: {variants['sampling']}", flush=True)

# Decode-step time of the stream variants (256 steps after a 64-token prompt), and their greedy tokens.
chat = tokenizer.apply_chat_template(list(MESSAGES), tokenize=False, add_generation_prompt=True)
ids = tokenizer([chat], return_tensors="pt").input_ids.to(info.torch_device)
reference = HfEngine(loaded).greedy(ids, int(cfg["check_tokens"]))
rows = []
for streams in ("none", "qkv", "qkv_mlp"):
    entry: dict = {"fast_streams": streams}
    try:
        options = FastOptions(compile=gpu, graphs=gpu, exact=True, parallel=streams != "none",
                              parallel_mlp=streams == "qkv_mlp")
        fast = FastQwen2(model, 576, options, eos_ids=[])
        fast.prepare(Sampling.greedy())
        entry["fallback"] = fast.compile_error
        tokens = fast.generate(ids[0], len(reference), Sampling.greedy(), stop_at_eos=False).tolist()
        entry["greedy_matches_hf"] = tokens == reference
        fast.prefill(ids[0, :64], Sampling.greedy())
        sync()
        t = time.perf_counter()
        fast.decode(256, Sampling.greedy())
        host_ms = (time.perf_counter() - t) * 1e3
        sync()
        step_ms = (time.perf_counter() - t) * 1e3 / 256
        entry.update(step_ms=step_ms, tok_s=1e3 / step_ms, pct_roofline=100 * 1e3 / step_ms / roofline,
                     host_enqueue_ms_per_step=host_ms / 256)
        del fast
    except Exception as exc:  # one variant failing must not hide the others
        entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
    rows.append(entry)
    print(f"[{time.perf_counter() - start:.0f} s] {entry}", flush=True)
variants["decode"] = rows
(out / "variants.json").write_text(json.dumps(variants, indent=2))
good = [r for r in rows if r.get("greedy_matches_hf") and not r.get("fallback") and "tok_s" in r]
if good and "fast_streams" not in overrides:
    cfg["fast_streams"] = max(good, key=lambda r: r["tok_s"])["fast_streams"]
print(f"[{time.perf_counter() - start:.0f} s] workflow measurement with fast_streams={cfg['fast_streams']}", flush=True)

results = run_llm(resolved, engines, cfg, target="gpu-session", fingerprint="unrecorded", copy_gbps=copy_gbps,
                  out_dir=out, loaded=loaded)
table = pd.DataFrame([r for rows in results.values() for r in rows])
for name, engine_rows in results.items():
    print(f"  {name}: {engine_rows[0].get('engine_detail', '')}", flush=True)

columns = ["engine", "test", "status", "n_prompt", "n_gen", "tok_s", "tok_s_sd", "mean_ms", "peak_alloc_gib",
           "peak_reserved_gib", "gbps", "pct_of_copy_bw", "tokens_match", "reason"]
with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
    print(table[[c for c in columns if c in table]].to_string(index=False))
    print(pd.DataFrame(rows).to_string(index=False))
print(f"roofline {roofline:.1f} tok/s; total {time.perf_counter() - start:.0f} s")
