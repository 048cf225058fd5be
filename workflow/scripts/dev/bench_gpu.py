"""Development run of the benchmark matrix on a lent GPU machine, without Snakemake.

    PYTHONPATH=workflow python3 workflow/scripts/dev/bench_gpu.py --out "$OUT" --budget-s 280

Measures the ceilings, optionally sweeps the Triton launch configurations on the target shapes, then
runs every (op, impl) cell with the same code the workflow's jobs run (gpulab.bench.runner), writing
ceilings.csv, <op>.csv and sweep.csv under --out, and prints a compact table last. The C++ extension
is built in a background thread (gpulab.extension) while the other implementations run.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import threading
import time
from pathlib import Path

import pandas as pd
from gpulab.bench.impls import extension_unavailable
from gpulab.bench.registry import BenchContext
from gpulab.bench.runner import BENCH, run_cell
from gpulab.bench.sizes import resolve_sizes
from gpulab.ceilings import CEILINGS, Ceilings, measure_ceilings
from gpulab.device import detect
from gpulab.timing import TimingSettings, measure

OPS = ("gelu", "softmax", "add")
# cpp_ext last: its build runs in the background meanwhile.
IMPLS = ("native", "triton", "torch_compile", "manual", "cpp_ext")


def sweep(out: Path, info, deadline: float) -> pd.DataFrame:
    """Time Triton launch configurations on the shapes the performance targets name."""
    import torch
    from gpulab.kernels.triton.add import add
    from gpulab.kernels.triton.gelu import gelu
    from gpulab.kernels.triton.softmax import softmax

    settings = TimingSettings(min_time_s=0.03, min_reps=10, max_reps=100, warmup_reps=2)
    rows = []

    def record(op: str, shape: tuple[int, ...], dtype: torch.dtype, config: dict, fn, nbytes: int) -> None:
        if time.monotonic() > deadline:
            return
        try:
            t = measure(fn, settings, info)
            rows.append({"op": op, "shape": "x".join(map(str, shape)), "dtype": str(dtype).split(".")[-1], **config,
                         "median_ms": t.median_ms, "gbps": nbytes / t.median_ms / 1e6})
        except Exception as exc:  # a config Triton refuses (too many registers) is data, not a crash
            rows.append({"op": op, "shape": "x".join(map(str, shape)), "dtype": str(dtype), **config,
                         "error": f"{type(exc).__name__}: {str(exc)[:200]}"})

    for dtype in (torch.float32, torch.bfloat16):
        item = torch.tensor([], dtype=dtype).element_size()
        n = 2**28
        x = torch.randn(n, device="cuda").to(dtype)
        y = torch.randn(n, device="cuda").to(dtype)
        for block_bytes in (8192, 16384, 32768):
            for warps in (4, 8, 16):
                block = block_bytes // item
                record("gelu", (n,), dtype, {"block": block, "num_warps": warps},
                       lambda b=block, w=warps, x=x: gelu(x, block_size=b, num_warps=w), 2 * n * item)
                record("add", (n,), dtype, {"block": block, "num_warps": warps},
                       lambda b=block, w=warps, x=x, y=y: add(x, y, block_size=b, num_warps=w), 3 * n * item)
        del x, y
        for shape, rows_opts in (((16384, 1024), (2, 4, 8, 16)), ((65536, 256), (8, 16, 32, 64)),
                                 ((4096, 16384), (1,))):
            x = torch.randn(shape, device="cuda").mul_(3).to(dtype)
            nbytes = 2 * x.numel() * item
            for rows_per in rows_opts:
                for warps in (4, 8, 16, 32) if rows_per == 1 else (4, 8, 16):
                    record("softmax", shape, dtype, {"rows": rows_per, "num_warps": warps},
                           lambda r=rows_per, w=warps, x=x: softmax(x, rows_per_program=r, num_warps=w), nbytes)
            if shape == (4096, 16384):
                for block in (2048, 4096, 8192):
                    for warps in (8, 16):
                        record("softmax_looped", shape, dtype, {"block": block, "num_warps": warps},
                               lambda b=block, w=warps, x=x: softmax(x, looped_block=b, num_warps=w), nbytes)
            del x
    df = pd.DataFrame(rows)
    df.to_csv(out / "sweep.csv", index=False)
    return df


def copy_by_size(info, settings: TimingSettings) -> list[dict]:
    """Device-to-device copy bandwidth at the sizes of the benchmark's smaller cases: what any kernel
    moving that many bytes can reach with this timing method (launch and tail included)."""
    import torch

    rows = []
    for mib in (4, 16, 32, 64, 128, 256, 1024):
        n = mib * 2**20 // 4
        pairs = [(torch.randn(n, device="cuda"), torch.empty(n, device="cuda")) for _ in range(2)]
        t = measure([lambda s=s, d=d: d.copy_(s) for s, d in pairs], settings, info)
        rows.append({"mib_per_buffer": mib, "median_ms": t.median_ms, "gbps": 2 * n * 4 / t.median_ms / 1e6,
                     "reps": t.reps, "cache_policy": t.cache_policy})
        del pairs
    return rows


def autotune_choices() -> pd.DataFrame:
    """The configuration Triton's autotuner picked per key (n_elements, dtypes) for the elementwise kernels."""
    rows = []
    try:
        from gpulab.kernels.triton.add import add_kernel
        from gpulab.kernels.triton.gelu import gelu_kernel
    except Exception:
        return pd.DataFrame()
    for name, kernel in (("gelu", gelu_kernel), ("add", add_kernel)):
        for key, config in getattr(kernel, "cache", {}).items():
            rows.append({"op": name, "n_elements": key[0], "dtype": key[-1],
                         "BLOCK_SIZE": config.kwargs.get("BLOCK_SIZE"), "num_warps": config.num_warps})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="h100")
    parser.add_argument("--budget-s", type=float, default=280)
    parser.add_argument("--sweep-s", type=float, default=0)
    parser.add_argument("--min-time-s", type=float, default=0.1)
    parser.add_argument("--max-reps", type=int, default=300)
    parser.add_argument("--ops", nargs="*", default=list(OPS))
    parser.add_argument("--impls", nargs="*", default=list(IMPLS))
    args = parser.parse_args()
    start = time.monotonic()
    deadline = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")
    info = detect()
    print(info)
    ctx = BenchContext(info, args.target)
    builder = None
    if "cpp_ext" in args.impls:
        builder = threading.Thread(target=extension_unavailable, args=(ctx,), daemon=True)
        builder.start()

    settings = TimingSettings(min_time_s=args.min_time_s, max_reps=args.max_reps)
    ceilings_rows = measure_ceilings({"copy_mib": "auto", "matmul_n": "auto", "dtypes": ["fp32", "fp16", "bf16"]},
                                     settings, target=args.target, fingerprint="dev", device=info)
    CEILINGS.write(ceilings_rows, args.out / "ceilings.csv")
    ceilings = Ceilings.load(args.out / "ceilings.csv")
    print(pd.DataFrame(ceilings_rows)[["kind", "dtype", "size", "gbps", "tflops", "median_ms", "cv"]].to_string())
    print(f"[{time.monotonic() - start:.0f}s] ceilings done", flush=True)

    copy_rows = copy_by_size(info, settings)
    pd.DataFrame(copy_rows).to_csv(args.out / "copy_sizes.csv", index=False)
    print(pd.DataFrame(copy_rows).to_string(index=False))

    if args.sweep_s > 0:
        table = sweep(args.out, info, min(deadline, time.monotonic() + args.sweep_s))
        print(f"[{time.monotonic() - start:.0f}s] sweep done: {len(table)} configs", flush=True)
        if not table.empty and "gbps" in table:
            best = table.sort_values("gbps", ascending=False).groupby(["op", "shape", "dtype"]).head(3)
            print(best.sort_values(["op", "shape", "dtype"]).to_string(index=False))

    all_rows: dict[str, list[dict]] = {op: [] for op in args.ops}
    for impl in args.impls:
        if impl == "cpp_ext" and builder is not None:
            builder.join(timeout=max(1.0, deadline - time.monotonic()))
            print(f"[{time.monotonic() - start:.0f}s] extension: {ctx.cache.get('cpp_ext')}", flush=True)
        for op in args.ops:
            shapes = resolve_sizes(op, "auto", info)
            rows = run_cell(op, impl, shapes=shapes, dtypes=["fp32", "fp16", "bf16"], settings=settings, ctx=ctx,
                            fingerprint="dev", ceilings=ceilings, deadline=deadline, progress=False)
            all_rows[op].extend(rows)
            BENCH.write(all_rows[op], args.out / f"{op}.csv")
            print(f"[{time.monotonic() - start:.0f}s] {op}/{impl} done", flush=True)

    autotuned = autotune_choices()
    if not autotuned.empty:
        autotuned.to_csv(args.out / "autotune.csv", index=False)
        print(autotuned.to_string(index=False))

    pd.set_option("display.width", 250)
    for op in args.ops:
        df = BENCH.frame(all_rows[op])
        cell = df.apply(lambda r: (f"{r['gbps']:.0f} {r['pct_of_copy_bw']:.0f}%" if r["status"] == "ok"
                                   else r["status"]), axis=1)
        grid = df.assign(cell=cell).pivot_table(index=["numel", "size", "dtype"], columns="impl", values="cell",
                                                aggfunc="first")
        print(f"\n== {op}: GB/s and % of copy BW")
        print(grid.reset_index(level=0, drop=True).to_string())
        bad = df[~df["status"].isin(["ok"])]
        for reason, group in bad.groupby("reason"):
            print(f"  {len(group)} x {group['status'].iloc[0]} ({', '.join(sorted(set(group['impl'])))}): {reason}")
    print(f"total {time.monotonic() - start:.0f}s; copy ceiling fp32 {ceilings.copy_gbps('fp32'):.0f} GB/s")
    return 0 if not math.isnan(ceilings.copy_gbps("fp32")) else 1


if __name__ == "__main__":
    sys.exit(main())
