"""The tutorial's timing experiment, reproduced exactly as it was done, next to a proper measurement.

The study timed one first call each of its add and ``x + y`` with ``time.time()`` right after loading the extension
(3.17 ms against 18.85 ms, read as 6x); first calls measure one-time costs. Here that runs in fresh processes, in
both orders, beside :func:`gpulab.core.timing.measure` of the same operations.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpulab.core.device import DeviceInfo, detect, probe
from gpulab.core.device_lock import arm_device_claim, child_should_claim
from gpulab.core.tables import Column, TableSchema
from gpulab.core.timing import TimingSettings, measure
from gpulab.core.tools import run_tool

TUTORIAL_SIZE = 1024 * 1024 * 10  # the tutorial's "1000万个元素" (10 Mi float32 elements)
BYTES_PER_ELEMENT = 3 * 4
# The study's own figures (AMD Radeon 8060S, ROCm 7.1), quoted in the report beside ours.
STUDY_MS = {"cpp_ext": 3.166, "native": 18.847}

PITFALLS = TableSchema(
    "timing_pitfalls",
    (
        Column("method", "str", "tutorial (one cold call each, host clock, custom op first, fresh process) | "
                                "tutorial_reversed (the same, native first) | measured (gpulab.core.timing.measure)"),
        Column("impl", "str", "cpp_ext (torch.ops.gpulab.vector_add) | native (x + y)"),
        Column("call_order", "int", "position of the call in its process for the tutorial methods (1 = first)"),
        Column("device", "str", "cuda (HIP on ROCm) | cpu"),
        Column("dtype", "str", "fp32"),
        Column("size", "int", "elements per vector"),
        Column("ms", "float", "what the method reports: the single host-clock reading, or the median"),
        Column("gbps", "float", "12 bytes per element over ms"),
        Column("speedup_vs_native", "float", "native ms / cpp_ext ms under the same method"),
        Column("correct", "bool", "cpp_ext's result equals x + y exactly"),
    ),
    measured=True,
    path="build/timing_pitfalls.csv",
)


def tutorial_measurement(manifest: Path, native_first: bool, size: int = TUTORIAL_SIZE) -> dict[str, Any]:
    """The tutorial's procedure, verbatim in substance; meant to run in a fresh process."""
    import torch

    from gpulab.native import load_from_manifest

    ops = load_from_manifest(manifest).ops
    info = detect()
    dev = info.torch_device
    x = torch.randn(size, device=dev)
    y = torch.randn(size, device=dev)

    def sync() -> None:
        if info.gpu_available:
            torch.cuda.synchronize()

    calls = {"cpp_ext": lambda: ops.vector_add(x, y), "native": lambda: x + y}
    order = ["native", "cpp_ext"] if native_first else ["cpp_ext", "native"]
    ms: dict[str, float] = {}
    outs = {}
    for name in order:
        sync()
        t1 = time.time()
        outs[name] = calls[name]()
        sync()
        t2 = time.time()
        ms[name] = (t2 - t1) * 1000
    return {"order": order, "ms": ms, "correct": bool(torch.equal(outs["cpp_ext"], outs["native"])),
            "device": dev}


def _tutorial_in_subprocess(manifest: Path, native_first: bool, size: int, timeout_s: float,
                            claim: bool = False) -> dict[str, Any]:
    import sys

    argv = [sys.executable, "-m", "gpulab.native.timing_pitfalls", "--manifest", str(manifest), "--size", str(size)]
    if native_first:
        argv.append("--native-first")
    if claim:
        argv.append("--claim-device")
    result = run_tool("python:gpulab.native.timing_pitfalls", argv, timeout_s=timeout_s)
    if result.status != "ok":
        raise RuntimeError(f"the tutorial measurement failed: {result.reason}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _single_reading(ms: float) -> dict[str, Any]:
    return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "mean_ms": ms, "min_ms": ms, "cv": math.nan, "reps": 1,
            "warmup_reps": 0, "first_call_ms": ms, "timer": "host_clock", "cache_policy": "none"}


def run_pitfalls(target: str, fingerprint: str, timing: TimingSettings, *, manifest: Path,
                 size: int = TUTORIAL_SIZE, device: DeviceInfo | None = None,
                 timeout_s: float = 600) -> list[dict[str, Any]]:
    """Rows of timing_pitfalls.csv: the tutorial's readings (both orders) and the measured medians, with
    the library the extension step's ``manifest`` names. The two tutorial processes start together and each
    claims the device for its reading (gpulab.core.device), so one starts PyTorch while the other measures; this
    process claims it after them."""
    import torch

    from gpulab.native import load_from_manifest

    info = device or probe()
    base = {"target": target, "fingerprint": fingerprint, "dtype": "fp32", "size": size,
            "device": info.torch_device}
    loaded = load_from_manifest(manifest)
    if loaded.status != "ok":
        status = "skipped" if loaded.status == "skipped" else "failed"
        return [{**base, "status": status, "reason": f"extension not available: {loaded.reason}",
                 "method": m, "impl": i} for m in ("tutorial", "tutorial_reversed", "measured")
                for i in ("cpp_ext", "native")]
    rows = []
    orders = (("tutorial", False), ("tutorial_reversed", True))
    claim = device is None and child_should_claim()
    with ThreadPoolExecutor(max_workers=len(orders)) as pool:
        readings = list(pool.map(lambda o: _tutorial_in_subprocess(manifest, o[1], size, timeout_s, claim), orders))
    if device is None:
        detect()
    for (method, _), got in zip(orders, readings, strict=True):
        speedup = got["ms"]["native"] / got["ms"]["cpp_ext"] if got["ms"]["cpp_ext"] > 0 else math.nan
        for position, impl in enumerate(got["order"], start=1):
            ms = got["ms"][impl]
            rows.append({**base, "status": "ok" if got["correct"] else "incorrect",
                         "reason": "" if got["correct"] else "cpp_ext result differs from x + y",
                         "method": method, "impl": impl, "call_order": position, "ms": ms,
                         "gbps": BYTES_PER_ELEMENT * size / (ms / 1e3) / 1e9, "speedup_vs_native": speedup,
                         "correct": got["correct"], **_single_reading(ms)})

    ops = loaded.ops
    dev = info.torch_device
    x = torch.randn(size, device=dev)
    y = torch.randn(size, device=dev)
    correct = bool(torch.equal(ops.vector_add(x, y), x + y))
    timings = {"cpp_ext": measure(lambda: ops.vector_add(x, y), timing, info),
               "native": measure(lambda: x + y, timing, info)}
    speedup = timings["native"].median_ms / timings["cpp_ext"].median_ms
    for impl, t in timings.items():
        rows.append({**base, "status": "ok" if correct else "incorrect",
                     "reason": "" if correct else "cpp_ext result differs from x + y",
                     "method": "measured", "impl": impl, "ms": t.median_ms,
                     "gbps": BYTES_PER_ELEMENT * size / (t.median_ms / 1e3) / 1e9, "speedup_vs_native": speedup,
                     "correct": correct, **t.as_row()})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One tutorial-style timing of custom add vs x + y (JSON).")
    parser.add_argument("--manifest", type=Path, required=True, help="the extension step's manifest")
    parser.add_argument("--size", type=int, default=TUTORIAL_SIZE)
    parser.add_argument("--native-first", action="store_true")
    parser.add_argument("--claim-device", action="store_true",
                        help="wait for, then hold, the run's device lock (gpulab.core.device) for the reading")
    args = parser.parse_args(argv)
    if args.claim_device:
        arm_device_claim()
    print(json.dumps(tutorial_measurement(args.manifest, args.native_first, args.size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

