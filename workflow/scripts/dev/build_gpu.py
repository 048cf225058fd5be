"""Development run of the build steps on a lent GPU machine, without Snakemake.

    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 workflow/scripts/dev/build_gpu.py --out "$OUT" --budget-s 280

In one process, with the same code the workflow's rules run: the environment fixtures (nvidia-smi -q,
ldd of torch's libraries, env.json), the standalone program built with nvcc for the detected arch and
run, the extension built cold into a fresh cache and loaded warm in a fresh process, its correctness
checks, the timing-pitfalls experiment, then cpp_ext against native PyTorch and torch.compile at large
sizes as a percentage of the measured copy bandwidth. Everything lands in results/<target>/ inside a
tarball under --out; a compact table is printed last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import pandas as pd

TARGET = "h100"


def sh(argv: list[str], out: Path) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out.write_text(f"{' '.join(argv)}: {exc}\n", encoding="utf-8")
        return
    out.write_text(proc.stdout + (f"\n--- stderr ---\n{proc.stderr}" if proc.stderr.strip() else ""), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=280)
    parser.add_argument("--target", default=TARGET)
    args = parser.parse_args()
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/gpulab_dev")
    shutil.rmtree(work, ignore_errors=True)
    res = work / "results" / args.target
    (res / "build").mkdir(parents=True)
    os.environ["GPULAB_CACHE_DIR"] = str(work / "cache")  # a cold cache: the build below is a real cold build
    summary: dict = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}

    import torch
    from gpulab.device import detect
    from gpulab.env_capture import capture, read_fingerprint

    info = detect()
    print(f"[{time.monotonic() - t0:5.1f}s] device: {info.name} {info.arch} backend={info.backend} "
          f"torch {torch.__version__} cuda {torch.version.cuda}", flush=True)
    lib = Path(torch.__file__).resolve().parent / "lib"
    sh(["nvidia-smi", "-q"], out / "nvidia_smi_q_h100.txt")
    sh(["ldd", str(lib / "libtorch_cuda.so")], out / "ldd_libtorch_cuda_h100.txt")
    sh(["ldd", str(lib / "libtorch_python.so")], out / "ldd_libtorch_python_h100.txt")
    try:
        capture(res / "env", target=args.target, config_hash="dev-build-gpu", timeout_s=60)
        fingerprint = read_fingerprint(res / "env" / "env.json")
    except Exception:
        traceback.print_exc()
        fingerprint = "dev-h100"
    print(f"[{time.monotonic() - t0:5.1f}s] env captured, fingerprint {fingerprint}", flush=True)

    from gpulab.timing import TimingSettings

    timing = TimingSettings()

    # ---- standalone program (nvcc, detected arch)
    from gpulab.hip_standalone import HIP_STANDALONE, run_standalone

    try:
        run_standalone(target=args.target, fingerprint=fingerprint,
                       build_config={"offload_archs": [], "extra_cflags": ["-O3"],
                                     "standalone_sizes": [1024, 98432, 1048576, 16777216, 67108864]},
                       timing=timing, out_csv=res / "build" / "hip_standalone.csv",
                       build_log=res / "build" / "hip_standalone_build.log",
                       run_log=res / "build" / "hip_standalone_run.log", work_dir=work / "standalone")
        sa = HIP_STANDALONE.read(res / "build" / "hip_standalone.csv")
        print(sa[["phase", "status", "compiler", "arch", "build_s", "size", "correct", "kernel_ms", "gbps",
                  "reason"]].to_string(index=False), flush=True)
    except Exception:
        traceback.print_exc()
    print(f"[{time.monotonic() - t0:5.1f}s] standalone done", flush=True)

    # ---- extension: cold build, warm load in a fresh process, checks (the rule's own function)
    from gpulab.extension import EXTENSION, EXTENSION_CHECKS, run_extension_step

    ext_ok = False
    try:
        cold = run_extension_step(args.target, fingerprint, {"offload_archs": [], "extra_cflags": ["-O3"]},
                                  out_csv=res / "build" / "extension.csv",
                                  checks_csv=res / "build" / "extension_checks.csv",
                                  build_log=res / "build" / "extension_build.log")
        ext_ok = cold.status == "ok"
        print(EXTENSION.read(res / "build" / "extension.csv")[["phase", "status", "backend", "arch", "compiler",
                                                                 "seconds", "cached"]].to_string(index=False))
        checks = EXTENSION_CHECKS.read(res / "build" / "extension_checks.csv")
        print(checks.groupby(["op", "dtype"]).agg(cases=("status", "size"), ok=("status", lambda s: (s == "ok").sum()),
                                                  max_abs_err=("max_abs_err", "max"), rel_err=("rel_err", "max"),
                                                  diff_native=("max_abs_diff_native", "max")).to_string(), flush=True)
        bad = checks[checks["status"] != "ok"]
        if not bad.empty:
            print("INCORRECT:\n" + bad[["op", "dtype", "shape", "layout", "reason", "max_abs_err"]].to_string())
    except Exception:
        traceback.print_exc()
        log = Path(os.environ["GPULAB_CACHE_DIR"])
        for p in log.rglob("build.log"):
            shutil.copy(p, res / "build" / "extension_build_failed.log")
            print(p.read_text()[-6000:])
    print(f"[{time.monotonic() - t0:5.1f}s] extension done (ok={ext_ok})", flush=True)

    # ---- the tutorial's timing experiment
    if ext_ok:
        from gpulab.timing_pitfalls import PITFALLS, run_pitfalls

        try:
            pit = PITFALLS.write(run_pitfalls(args.target, fingerprint, timing), res / "build" / "timing_pitfalls.csv")
            print(pit[["method", "impl", "call_order", "status", "ms", "speedup_vs_native"]].to_string(index=False),
                  flush=True)
        except Exception:
            traceback.print_exc()
    print(f"[{time.monotonic() - t0:5.1f}s] pitfalls done", flush=True)

    # ---- performance: cpp_ext vs native vs torch.compile, % of measured copy bandwidth
    perf_rows = []
    if ext_ok:
        try:
            perf_rows = performance(res, info, fingerprint, deadline, t0)
        except Exception:
            traceback.print_exc()
    summary["elapsed_s"] = time.monotonic() - t0
    (res / "build" / "summary.json").write_text(json.dumps(summary, indent=2))
    with tarfile.open(out / "build_gpu_results.tar.gz", "w:gz") as tar:
        tar.add(work / "results", arcname="results")
        for p in Path(os.environ["GPULAB_CACHE_DIR"]).rglob("build.*"):
            tar.add(p, arcname=f"cache/{p.relative_to(os.environ['GPULAB_CACHE_DIR'])}")
    if perf_rows:
        df = pd.DataFrame(perf_rows)
        pd.set_option("display.width", 200)
        print("\n=== cpp_ext vs best of native / torch.compile (median ms, % of copy GB/s) ===")
        print(df[["op", "shape", "dtype", "impl", "ms", "gbps", "pct_copy", "vs_best_other"]].to_string(index=False))
    print(f"[{time.monotonic() - t0:5.1f}s] all done", flush=True)
    return 0


def performance(res: Path, info, fingerprint: str, deadline: float, t0: float) -> list[dict]:
    import torch
    from gpulab.ceilings import CEILINGS, Ceilings, measure_ceilings
    from gpulab.timing import TimingSettings, measure

    ceil_rows = measure_ceilings({"copy_mib": 1024, "matmul_n": 4096, "dtypes": ["fp32", "bf16"]}, TimingSettings(),
                                 target="h100", fingerprint=fingerprint, device=info)
    CEILINGS.write(ceil_rows, res / "build" / "ceilings.csv")
    ceilings = Ceilings.load(res / "build" / "ceilings.csv")
    print(f"[{time.monotonic() - t0:5.1f}s] copy GB/s fp32 {ceilings.copy_gbps('fp32'):.0f} "
          f"bf16 {ceilings.copy_gbps('bf16'):.0f}", flush=True)
    ops = torch.ops.gpulab
    settings = TimingSettings(min_time_s=0.2)
    F = torch.nn.functional
    cases = []  # (op, shape, dtype, bytes, {impl: fn}, inputs)
    for dtype in (torch.float32, torch.bfloat16):
        item = torch.tensor([], dtype=dtype).element_size()
        for mib in (256, 1024):
            n = mib * 2**20 // item
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            cases.append(("gelu", (n,), dtype, 2 * n * item, {"cpp_ext": lambda x=x: ops.gelu_tanh(x),
                          "native": lambda x=x: F.gelu(x, approximate="tanh")}, (x,)))
            cases.append(("add", (n,), dtype, 3 * n * item, {"cpp_ext": lambda x=x, y=y: ops.vector_add(x, y),
                          "native": lambda x=x, y=y: x + y}, (x, y)))
        for shape in ((16384, 1024), (4096, 16384), (65536, 256)):
            x = torch.randn(shape, device="cuda").to(dtype)
            n = x.numel()
            cases.append(("softmax", shape, dtype, 2 * n * item, {"cpp_ext": lambda x=x: ops.softmax_rows(x),
                          "native": lambda x=x: torch.softmax(x, -1)}, (x,)))
    rows = []
    for op, shape, dtype, nbytes, fns, _ in cases:
        ref = fns["native"]()
        got = fns["cpp_ext"]()
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        ok = torch.allclose(got.float(), ref.float(), rtol=tol, atol=1e-5 if op != "softmax" else 1e-7)
        del ref, got
        dname = "fp32" if dtype == torch.float32 else "bf16"
        copy = ceilings.copy_gbps(dname)
        for impl, fn in fns.items():
            t = measure(fn, settings, info)
            gbps = nbytes / (t.median_ms / 1e3) / 1e9
            rows.append({"op": op, "shape": "x".join(map(str, shape)), "dtype": dname, "impl": impl,
                         "ms": t.median_ms, "gbps": gbps, "pct_copy": 100 * gbps / copy, "correct": ok,
                         "reps": t.reps, "cv": t.cv})
        print(f"[{time.monotonic() - t0:5.1f}s] {op} {shape} {dname}: " + ", ".join(
            f"{r['impl']} {r['ms']:.3f} ms {r['pct_copy']:.1f}%" for r in rows[-2:]) + f" correct={ok}", flush=True)
    # torch.compile last, under the time budget (each compile costs seconds).
    compiled = {"gelu": torch.compile(lambda x: F.gelu(x, approximate="tanh"), dynamic=False),
                "add": torch.compile(lambda x, y: x + y, dynamic=False),
                "softmax": torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)}
    for op, shape, dtype, nbytes, _, inputs in cases:
        if time.monotonic() > deadline - 25:
            print("time budget: skipping remaining torch.compile cases", flush=True)
            break
        if op != "softmax" and shape[0] * torch.tensor([], dtype=dtype).element_size() > 256 * 2**20:
            continue  # one size per elementwise op is enough for the comparison
        fn = compiled[op]
        try:
            t = measure(lambda fn=fn, inputs=inputs: fn(*inputs), settings, info)
        except Exception as exc:
            print(f"torch.compile {op} failed: {exc}")
            continue
        dname = "fp32" if dtype == torch.float32 else "bf16"
        gbps = nbytes / (t.median_ms / 1e3) / 1e9
        rows.append({"op": op, "shape": "x".join(map(str, shape)), "dtype": dname, "impl": "torch_compile",
                     "ms": t.median_ms, "gbps": gbps, "pct_copy": 100 * gbps / ceilings.copy_gbps(dname),
                     "correct": True, "reps": t.reps, "cv": t.cv, "compile_ms": t.first_call_ms})
        print(f"[{time.monotonic() - t0:5.1f}s] torch.compile {op} {shape} {dname}: {t.median_ms:.3f} ms "
              f"(first call {t.first_call_ms:.0f} ms)", flush=True)
    df = pd.DataFrame(rows)
    best_other = df[df["impl"] != "cpp_ext"].groupby(["op", "shape", "dtype"])["ms"].min()
    df["vs_best_other"] = [
        best_other.get((r.op, r.shape, r.dtype), float("nan")) / r.ms if r.impl == "cpp_ext" else float("nan")
        for r in df.itertuples()
    ]
    df.to_csv(res / "build" / "perf.csv", index=False)
    return df.to_dict("records")


if __name__ == "__main__":
    sys.exit(main())
