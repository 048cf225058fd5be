"""Dev run of the MLP profile on a lent GPU machine (no Snakemake there): one call does what the rules
env_capture, bench_ceilings and mlp_profile do, through the same library functions, into
``$OUT/results/<target>/``, then prints a compact table.

    PYTHONPATH=workflow python3 workflow/scripts/dev/mlp_gpu.py TARGET
"""

from __future__ import annotations

import logging
import os
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
from gpulab.ceilings import CEILINGS, Ceilings, measure_ceilings
from gpulab.config import config_hash
from gpulab.device import detect
from gpulab.env_capture import capture
from gpulab.mlp.kernels import short_kernel_name
from gpulab.mlp.profile import profile_mlp
from gpulab.timing import TimingSettings

CONFIG = {
    "timing": {"min_time_s": 0.25, "warmup_reps": 3, "flush_cache": True},
    "ceilings": {"copy_mib": "auto", "matmul_n": "auto", "dtypes": ["fp32", "fp16", "bf16"]},
    "mlp": {"dim": 2048, "num_layers": 64, "batch": 1024, "num_steps": 5,
            "variants": ["fp32", "tf32", "bf16", "compiled"]},
}


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "h100"
    out = Path(os.environ.get("OUT", "/tmp/mlp-gpu-out"))
    root = out / "results" / target
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    info = detect()
    print(f"device: {info.name} ({info.backend}, {info.arch}), torch {info.torch_version}", flush=True)
    env = capture(root / "env", target=target, config_hash=config_hash(CONFIG), timeout_s=60, device=info)
    print(f"[{time.perf_counter() - t0:.0f}s] env captured, fingerprint {env['fingerprint']}", flush=True)
    timing = TimingSettings.from_config(CONFIG["timing"])
    rows = measure_ceilings(CONFIG["ceilings"], timing, target=target, fingerprint=env["fingerprint"], device=info)
    CEILINGS.write(rows, root / "bench" / "ceilings.csv")
    ceilings = Ceilings.load(root / "bench" / "ceilings.csv")
    print(f"[{time.perf_counter() - t0:.0f}s] ceilings:", flush=True)
    print(ceilings.table[["kind", "dtype", "size", "gbps", "tflops", "median_ms"]].to_string(index=False), flush=True)
    summary = profile_mlp(CONFIG["mlp"], timing, target=target, fingerprint=env["fingerprint"], ceilings=ceilings,
                          out_dir=root / "mlp", device=info)
    print(f"[{time.perf_counter() - t0:.0f}s] MLP profiled", flush=True)
    kernels = pd.read_csv(root / "mlp" / "kernels.csv")

    # Everything but the traces in one archive; each trace on its own (the machine returns 8 files at most).
    with tarfile.open(out / f"results-{target}.tgz", "w:gz") as tar:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.name.startswith("trace_"):
                tar.add(path, arcname=str(path.relative_to(out)))
    for trace in sorted((root / "mlp").glob("trace_*.json.gz")):
        trace.rename(out / trace.name)

    pd.set_option("display.width", 200)
    cols = ["variant", "status", "median_ms", "p10_ms", "p90_ms", "tflops", "ceiling_tflops", "pct_of_ceiling",
            "matmul_share", "profiled_ms_per_step", "rel_err_output", "rel_err_grad", "max_memory_allocated_bytes",
            "max_memory_reserved_bytes", "first_call_ms", "reason"]
    print(summary[cols].to_string(index=False))
    for variant, part in kernels.groupby("variant", sort=False):
        shares = part.groupby("category")["share"].sum().round(3).to_dict()
        print(f"\n{variant}: category shares {shares}; phases "
              f"{part.groupby('phase')['time_per_step_us'].sum().div(1e3).round(3).to_dict()} ms/step")
        top = part.groupby("kernel", as_index=False)[["time_per_step_us", "share", "calls"]].sum()
        for row in top.sort_values("time_per_step_us", ascending=False).head(3).itertuples():
            print(f"  {row.time_per_step_us / 1e3:8.3f} ms/step {row.share:6.1%} x{row.calls:<4} "
                  f"{short_kernel_name(row.kernel)}  |  {row.kernel[:160]}")
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
