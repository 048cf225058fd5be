"""Run the MLP profile of one target: every variant checked, timed, profiled, written to ``mlp/``.

Per variant: one step compared with a float64 reference (output and last-layer weight gradient), the
allocator's peak over one step, the step timed with :func:`gpulab.timing.measure`, then ``num_steps``
steps under ``torch.profiler`` whose Chrome trace, flame-graph stacks, operator table and device
kernels are written. A variant that cannot run here (TF32 off CUDA) or breaks (out of memory, a
compiler missing) is a recorded row with its reason; its trace and stacks files say the same.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.profiler import record_function

from gpulab.ceilings import Ceilings, pct_of
from gpulab.device import DeviceInfo, detect, synchronize
from gpulab.mlp.kernels import (
    BACKWARD_RANGE,
    FORWARD_RANGE,
    cpu_op_records,
    device_kernel_records,
    kernel_table,
    op_table,
)
from gpulab.mlp.model import MLP, VARIANTS, MLPShape, Variant, matmul_flops, resolve_shape
from gpulab.tables import Column, TableSchema, write_atomic
from gpulab.timing import TimingSettings, measure

log = logging.getLogger(__name__)

MLP_SUMMARY = TableSchema(
    "mlp_summary",
    (
        Column("variant", "str", "fp32 | tf32 (CUDA only) | bf16 (autocast) | compiled (torch.compile, fp32)"),
        Column("ceiling_dtype", "str", "matmul ceiling (bench/ceilings.csv) the variant is placed against"),
        Column("dim", "int", "hidden size"),
        Column("num_layers", "int", "Linear -> GeLU layers"),
        Column("batch", "int", "rows of the input"),
        Column("profiled_steps", "int", "forward+backward steps inside the profiled window"),
        Column("activities", "str", "torch.profiler activities recorded: CPU,CUDA (CUDA is HIP on ROCm) or CPU"),
        Column("time_source", "str", "device_kernel: kernel times on the GPU; cpu_op_self: CPU-only run, "
               "ATen ops' own CPU time"),
        Column("step_matmul_flops", "float", "matmul FLOPs of one forward+backward step, 2·B·D²·(3L-1)"),
        Column("tflops", "float", "achieved matmul TFLOP/s at the median step time"),
        Column("ceiling_tflops", "float", "measured matmul ceiling of ceiling_dtype on this target"),
        Column("pct_of_ceiling", "float", "tflops as % of ceiling_tflops"),
        Column("rel_err_output", "float", "relative L2 error of the output against a float64 reference"),
        Column("rel_err_grad", "float", "relative L2 error of the last layer's weight gradient"),
        Column("tolerance", "float", "largest relative error accepted for this variant"),
        Column("max_memory_allocated_bytes", "int", "allocator peak of tensors over one step (GPU only)"),
        Column("max_memory_reserved_bytes", "int", "caching allocator's peak reservation over one step (GPU only)"),
        Column("profiled_ms_per_step", "float", "kernel time (CPU-only: compute ops' time) per profiled step"),
        Column("matmul_share", "float", "fraction of profiled kernel time spent in matmul kernels"),
        Column("trace", "str", "Chrome/Perfetto trace of the profiled steps, next to this file"),
        Column("stacks", "str", "collapsed stacks for a flame graph (export_stacks), next to this file"),
    ),
    measured=True,
)

MLP_KERNELS = TableSchema(
    "mlp_kernels",
    (
        Column("variant", "str", "precision variant"),
        Column("time_source", "str", "device_kernel | cpu_op_self (CPU-only run: the rows are ATen ops)"),
        Column("phase", "str", "forward | backward | other (launched outside the step's forward/backward)"),
        Column("category", "str", "matmul | activation (GeLU and other elementwise math) | reduction | "
               "other (copies, dtype casts, fills, memsets, unrecognised)"),
        Column("kernel", "str", "kernel name as the profiler reports it"),
        Column("launched_by", "str", "CPU op that launched it (CPU-only run: the op's caller)"),
        Column("calls", "int", "executions inside the profiled window"),
        Column("time_us", "float", "self time summed over the profiled window (µs)"),
        Column("time_per_step_us", "float", "time_us per profiled step"),
        Column("share", "float", "fraction of the variant's total kernel time"),
    ),
)

MLP_OPS = TableSchema(
    "mlp_ops",
    (
        Column("variant", "str", "precision variant"),
        Column("op", "str", "key of torch.profiler's key_averages() (op, range or device activity)"),
        Column("device_type", "str", "CPU for ops and ranges; CUDA for device activities"),
        Column("calls", "int", "occurrences inside the profiled window"),
        Column("cpu_total_us", "float", "CPU time including children (µs)"),
        Column("self_cpu_us", "float", "CPU time excluding children (µs)"),
        Column("device_total_us", "float", "device time including children (µs)"),
        Column("self_device_us", "float", "device time excluding children (µs)"),
        Column("user_annotation", "bool", "a record_function range rather than an op"),
    ),
)

PROFILED_ARTIFACTS = ("summary.csv", "kernels.csv", "ops.csv")


def trace_name(variant: str) -> str:
    return f"trace_{variant}.json.gz"


def stacks_name(variant: str) -> str:
    return f"stacks_{variant}.txt"


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """‖value − reference‖ / ‖reference‖ in float64 (NaN stays NaN, so it never passes)."""
    diff = torch.linalg.vector_norm(value.detach().double() - reference)
    norm = torch.linalg.vector_norm(reference)
    return float(diff / norm) if float(norm) > 0 else float(diff)


def float64_reference(model: MLP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and last-layer weight gradient of the same model and input, computed in float64."""
    reference = copy.deepcopy(model).double()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    last = reference.layers[-1].weight
    last.requires_grad_(True)
    out = reference(x.double())
    out.mean().backward()
    return out.detach(), last.grad.detach()


def make_step(model: MLP, forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, variant: Variant,
              info: DeviceInfo) -> Callable[[], torch.Tensor]:
    """One training step as the study writes it: ``model(x).mean()``, then ``backward()``.

    Gradients are dropped first (set to None, which launches nothing) so every step does the same work;
    accumulating into existing gradients, as the study's loop does, adds an elementwise add per
    parameter from the second step on.
    """

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        with record_function(FORWARD_RANGE), variant.autocast(info):
            out = forward(x)
            loss = out.mean()
        with record_function(BACKWARD_RANGE):
            loss.backward()
        return out

    return step


def peak_memory(step: Callable[[], Any], info: DeviceInfo) -> tuple[int | None, int | None]:
    """Allocator peaks over one step, from an emptied cache (so reserved is this variant's, not the last's)."""
    if not info.gpu_available:
        return None, None
    synchronize(info)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step()
    synchronize(info)
    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


def profiler_activities(info: DeviceInfo) -> list[Any]:
    from torch.profiler import ProfilerActivity

    # ROCm builds record HIP kernels under the CUDA activity too.
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if info.gpu_available else [])]


def run_profiler(step: Callable[[], Any], steps: int, info: DeviceInfo) -> Any:
    """``steps`` warmed-up steps under torch.profiler, with Python stacks for the flame graph."""
    from torch.profiler import profile

    kwargs: dict[str, Any] = {}
    experimental = getattr(torch._C._profiler, "_ExperimentalConfig", None)
    if experimental is not None:  # verbose keeps Python frames in the stacks export_stacks writes
        kwargs["experimental_config"] = experimental(verbose=True)
    synchronize(info)
    with profile(activities=profiler_activities(info), with_stack=True, **kwargs) as prof:
        for _ in range(steps):
            step()
        synchronize(info)
    return prof


def write_trace(prof: Any, path: Path) -> None:
    """The Chrome trace, gzipped, written atomically (torch writes plain JSON to a scratch file first)."""
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(scratch)
        with open(scratch, "rb") as fh:
            write_atomic(path, gzip.compress(fh.read(), compresslevel=6))
    finally:
        Path(scratch).unlink(missing_ok=True)


def write_stacks(prof: Any, path: Path, info: DeviceInfo) -> int:
    """Collapsed stacks weighted by device time (CPU time on CPU-only runs); returns the line count."""
    metric = "self_cuda_time_total" if info.gpu_available else "self_cpu_time_total"
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".txt")
    os.close(fd)
    try:
        prof.export_stacks(scratch, metric)
        text = Path(scratch).read_text(encoding="utf-8")
    finally:
        Path(scratch).unlink(missing_ok=True)
    write_atomic(path, text)
    return text.count("\n")


def write_unprofiled(out_dir: Path, variant: str, status: str, reason: str) -> None:
    """Trace and stacks of a variant that was not profiled: a valid, empty trace that says why."""
    trace = {"traceEvents": [], "otherData": {"gpulab_variant": variant, "gpulab_status": status,
                                               "gpulab_reason": reason}}
    write_atomic(out_dir / trace_name(variant), gzip.compress(json.dumps(trace).encode()))
    write_atomic(out_dir / stacks_name(variant), "")


@contextlib.contextmanager
def compile_settings(variant: Variant, info: DeviceInfo) -> Any:
    """On CPU, have Inductor's C++ kernels record themselves, or the profile only shows the graph call."""
    if variant.compiled and not info.gpu_available:
        import torch._inductor.config as inductor_config

        with inductor_config.patch({"cpp.enable_kernel_profile": True}):
            yield
    else:
        yield


def profile_variant(
    variant: Variant, model: MLP, x: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor],
    shape: MLPShape, timing: TimingSettings, info: DeviceInfo, out_dir: Path,
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """Check, time and profile one variant; returns its summary fields and its kernel and op tables."""
    with variant.matmul_precision(), compile_settings(variant, info):
        forward = torch.compile(model) if variant.compiled else model
        step = make_step(model, forward, x, variant, info)
        out = step()  # also the compilation of the compiled variant
        synchronize(info)
        err_out = relative_error(out, reference[0])
        err_grad = relative_error(model.layers[-1].weight.grad, reference[1])
        del out
        correct = all(math.isfinite(e) and e <= variant.tolerance for e in (err_out, err_grad))
        allocated, reserved = peak_memory(step, info)
        timed = measure(step, timing, info)
        prof = run_profiler(step, shape.num_steps, info)
    write_trace(prof, out_dir / trace_name(variant.name))
    stack_lines = write_stacks(prof, out_dir / stacks_name(variant.name), info)
    events = prof.events()
    records = device_kernel_records(events) if info.gpu_available else cpu_op_records(events)
    kernels = kernel_table(records, shape.num_steps)
    ops = op_table(prof.key_averages())
    total_us = float(kernels["time_us"].sum()) if not kernels.empty else math.nan
    matmul_us = float(kernels.loc[kernels["category"] == "matmul", "time_us"].sum()) if not kernels.empty else 0.0
    flops = matmul_flops(shape)
    tflops = flops / (timed.median_ms / 1e3) / 1e12
    fields: dict[str, Any] = {
        "status": "ok" if correct else "incorrect",
        "reason": "" if correct else (f"relative error {max(err_out, err_grad):.3g} (output {err_out:.3g}, "
                                      f"gradient {err_grad:.3g}) exceeds {variant.tolerance:g}"),
        "tflops": tflops,
        "rel_err_output": err_out,
        "rel_err_grad": err_grad,
        "max_memory_allocated_bytes": allocated,
        "max_memory_reserved_bytes": reserved,
        "profiled_ms_per_step": total_us / shape.num_steps / 1e3,
        "matmul_share": matmul_us / total_us if total_us > 0 else math.nan,
        **timed.as_row(),
    }
    log.info("%s: %.3f ms/step, %.1f TFLOP/s, rel err %.2g/%.2g, %d kernel rows, %d stack lines",
             variant.name, timed.median_ms, tflops, err_out, err_grad, len(kernels), stack_lines)
    return fields, kernels, ops


def _release(variant: Variant, model: MLP, info: DeviceInfo) -> None:
    model.zero_grad(set_to_none=True)
    if variant.compiled:
        torch._dynamo.reset()  # drop the compiled graphs (and their memory) before the next variant
    if info.gpu_available:
        synchronize(info)
        torch.cuda.empty_cache()


def _failure(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom", f"out of device memory: {str(exc).splitlines()[0]}"
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return "failed", f"{type(exc).__name__}: {first}"


def profile_mlp(
    config: Mapping[str, Any],
    timing: TimingSettings,
    *,
    target: str,
    fingerprint: str,
    ceilings: Ceilings | None,
    out_dir: str | Path,
    device: DeviceInfo | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Profile every configured variant and write ``summary.csv``, ``kernels.csv``, ``ops.csv`` and each
    variant's ``trace_<variant>.json.gz`` and ``stacks_<variant>.txt`` under ``out_dir``.

    ``config`` is the ``mlp`` section. Returns the summary table.
    """
    info = device or detect()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    unknown = [v for v in config.get("variants", []) if v not in VARIANTS]
    if unknown:
        raise ValueError(f"mlp.variants: unknown variant(s) {unknown}; expected some of {list(VARIANTS)}")
    variants = [VARIANTS[name] for name in config.get("variants", list(VARIANTS))]
    shape = resolve_shape(config, info)
    activities = "CPU,CUDA" if info.gpu_available else "CPU"
    if not info.gpu_available:
        log.info("no GPU (%s): CPU activities only; kernel rows are ATen ops' self CPU time", info.reason)
    log.info("MLP dim=%d layers=%d batch=%d, %d profiled steps, on %s (%s)", shape.dim, shape.num_layers,
             shape.batch, shape.num_steps, info.name, info.backend)

    base = {"target": target, "fingerprint": fingerprint, "dim": shape.dim, "num_layers": shape.num_layers,
            "batch": shape.batch, "profiled_steps": shape.num_steps, "activities": activities,
            "time_source": "device_kernel" if info.gpu_available else "cpu_op_self",
            "step_matmul_flops": float(matmul_flops(shape))}
    summary: list[dict[str, Any]] = []
    kernel_frames: list[pd.DataFrame] = []
    op_frames: list[pd.DataFrame] = []

    setup_error: tuple[str, str] | None = None
    try:
        torch.manual_seed(seed)
        model = MLP(shape.dim, shape.num_layers).to(info.torch_device)
        x = torch.randn(shape.batch, shape.dim, device=info.torch_device)
        reference = float64_reference(model, x)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        log.exception("could not set up the MLP")
        setup_error = _failure(exc)

    for variant in variants:
        ceiling = ceilings.matmul_tflops(variant.ceiling_dtype) if ceilings is not None else math.nan
        row = {**base, "variant": variant.name, "ceiling_dtype": variant.ceiling_dtype, "ceiling_tflops": ceiling,
               "tolerance": variant.tolerance, "trace": trace_name(variant.name),
               "stacks": stacks_name(variant.name)}
        why = variant.unavailable(info)
        if why or setup_error:
            status, reason = ("skipped", why) if why else setup_error
            log.info("%s: %s (%s)", variant.name, status, reason)
            write_unprofiled(out_dir, variant.name, status, reason)
            summary.append({**row, "status": status, "reason": reason})
            continue
        try:
            fields, kernels, ops = profile_variant(variant, model, x, reference, shape, timing, info, out_dir)
        except Exception as exc:  # one broken variant (OOM, no C++ compiler) must not lose the others
            log.exception("variant %s failed", variant.name)
            status, reason = _failure(exc)
            write_unprofiled(out_dir, variant.name, status, reason)
            summary.append({**row, "status": status, "reason": reason})
            continue
        finally:
            _release(variant, model, info)
        fields["pct_of_ceiling"] = pct_of(fields["tflops"], ceiling)
        summary.append({**row, **fields})
        common = {"target": target, "fingerprint": fingerprint, "status": "ok", "reason": "",
                  "variant": variant.name}
        kernel_frames.append(kernels.assign(**common, time_source=base["time_source"]))
        op_frames.append(ops.assign(**common))

    MLP_KERNELS.write(_records(kernel_frames), out_dir / "kernels.csv")
    MLP_OPS.write(_records(op_frames), out_dir / "ops.csv")
    return MLP_SUMMARY.write(summary, out_dir / "summary.csv")


def strict_rows(summary: pd.DataFrame, device: DeviceInfo | None = None) -> pd.DataFrame:
    """Rows strict mode judges: variants this backend has at all (TF32 on ROCm is recorded, not a failure)."""
    info = device or detect()
    return summary[[VARIANTS[v].unavailable(info) is None for v in summary["variant"]]]


def _records(frames: list[pd.DataFrame]) -> list[dict[str, Any]]:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True).to_dict("records") if frames else []
