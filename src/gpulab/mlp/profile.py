"""Run the MLP profile of one target: every variant checked, timed, profiled, written to ``mlp/``.

Per variant the timed closure (an eager step or a graph replay) is checked against a float64 reference first (a
failing one is ``incorrect``, neither timed nor profiled), then its peak memory, its timing and ``num_steps`` calls
under ``torch.profiler`` (trace, stacks, op table, kernels); a variant that cannot run here is a row with its reason.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import gzip
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.profiler import record_function

from gpulab.core.ceilings import CEILINGS, MISS, Ceilings, above_ceiling, pct_of
from gpulab.core.device import DeviceInfo, detect, synchronize, teardown_profiler_after_use, warm_on_side_stream
from gpulab.core.energy import ENERGY_SPAN_S, per_unit
from gpulab.core.kernel_trace import (
    BACKWARD_RANGE,
    FORWARD_RANGE,
    GRAPH_LAUNCH,
    GRAPH_RANGE,
    HOST_BOUND_SHARE,
    cpu_op_records,
    device_kernel_records,
    kernel_table,
    op_table,
)
from gpulab.core.tables import Column, TableSchema, write_atomic
from gpulab.core.timing import TimingSettings, measure
from gpulab.mlp.model import MLP, VARIANTS, MLPShape, Variant, matmul_flops, resolve_shape

log = logging.getLogger(__name__)

# Steps run on a side stream before a capture, as PyTorch's CUDA graphs notes require (cuBLAS workspaces,
# autograd's and the allocator's lazy state are set up outside the graph).
GRAPH_WARMUP_STEPS = 3

MLP_SUMMARY = TableSchema(
    "mlp_summary",
    (
        Column("variant", "str", "fp32 | tf32 (CUDA only) | bf16 (autocast) | compiled (torch.compile, fp32) | "
               "tf32_graph | bf16_graph | bf16_weights (bf16 parameters, no autocast) | bf16_weights_graph; "
               "*_graph: the whole step replayed as one CUDA/HIP graph"),
        Column("ceiling_dtype", "str",
               f"matmul ceiling ({CEILINGS.path}, mlp/ceilings.csv) the variant is placed against"),
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
        Column("ceiling_method", "str", f"the method and shape that set ceiling_tflops ({CEILINGS.path})"),
        Column("pct_of_ceiling", "float", "tflops as % of ceiling_tflops"),
        Column("above_ceiling", "bool", "tflops exceeds ceiling_tflops by more than the spread (p90/p10) of both: "
               "then the ceiling is not trustworthy (as a benchmark row is judged)"),
        Column("tflop_per_j", "float", "matmul TFLOP per joule of device energy (energy_j of one step); empty where "
               "the energy is unknown (energy_reason says why)"),
        Column("rel_err_output", "float", "relative L2 error of the output against a float64 reference"),
        Column("rel_err_grad", "float", "relative L2 error of the last layer's weight gradient"),
        Column("tolerance", "float", "largest relative error accepted for this variant"),
        Column("max_memory_allocated_bytes", "int", "allocator peak of tensors over one step (GPU only)"),
        Column("max_memory_reserved_bytes", "int", "caching allocator's peak reservation over one step (GPU only)"),
        Column("profiled_ms_per_step", "float", "kernel time (CPU-only: compute ops' time) per profiled step"),
        Column("matmul_share", "float", "fraction of profiled kernel time spent in matmul kernels"),
        Column("kernel_step_share", "float", "profiled_ms_per_step / median_ms: the share of the step the device "
               "spends in kernels (device runs only)"),
        Column("host_bound", "bool", f"kernel_step_share < {HOST_BOUND_SHARE}: the device waits for the host "
               "between kernels (device runs only)"),
        Column("trace", "str", "Chrome/Perfetto trace of the profiled steps, next to this file"),
        Column("stacks", "str", "collapsed stacks for a flame graph (export_stacks), next to this file"),
    ),
    measured=True,
    path="mlp/summary.csv",
)

MLP_KERNELS = TableSchema(
    "mlp_kernels",
    (
        Column("variant", "str", "precision variant"),
        Column("time_source", "str", "device_kernel | cpu_op_self (CPU-only run: the rows are ATen ops)"),
        Column("phase", "str", "forward | backward | graph (a graph variant's replay: the whole step) | other "
               "(launched outside the step's forward/backward)"),
        Column("category", "str", "matmul | activation (GeLU and other elementwise math) | reduction | "
               "other (copies, dtype casts, fills, memsets, unrecognised)"),
        Column("kernel", "str", "kernel name as the profiler reports it"),
        Column("launched_by", "str", "CPU op that launched it (CPU-only run: the op's caller)"),
        Column("calls", "int", "executions inside the profiled window"),
        Column("time_us", "float", "self time summed over the profiled window (µs)"),
        Column("time_per_step_us", "float", "time_us per profiled step"),
        Column("share", "float", "fraction of the variant's total kernel time"),
    ),
    path="mlp/kernels.csv",
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
    path="mlp/ops.csv",
)

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


@dataclass
class PreparedStep:
    """The closure that is checked, timed and profiled, and where its results land."""

    run: Callable[[], None]
    model: MLP  # the module whose gradients a run leaves (a bf16 copy for bf16_weights variants)
    x: torch.Tensor
    last_output: list[torch.Tensor | None] = field(default_factory=lambda: [None])
    graph: Any = None

    def output(self) -> torch.Tensor:
        out = self.last_output[0]
        if out is None:
            raise RuntimeError("the step has not run")
        return out

    def grad(self) -> torch.Tensor:
        grad = self.model.layers[-1].weight.grad
        if grad is None:
            raise RuntimeError("the step left no gradient on the last layer")
        return grad

    def poison(self) -> None:
        """Make stale results fail the check: a graph's static output and gradients become NaN (a replay must
        overwrite them); an eager step's gradients are dropped (it must create them)."""
        if self.graph is None:
            self.model.zero_grad(set_to_none=True)
            self.last_output[0] = None
            return
        with torch.no_grad():
            self.output().fill_(math.nan)
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.fill_(math.nan)


def prepare_step(variant: Variant, model: MLP, x: torch.Tensor, info: DeviceInfo) -> PreparedStep:
    """The variant's step: eager, compiled, or captured once in a CUDA/HIP graph and replayed."""
    if variant.bf16_weights:
        model, x = copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16)
    forward = torch.compile(model) if variant.compiled else model
    step = make_step(model, forward, x, variant, info)
    if variant.graph:
        return capture_step(step, model, x)
    prepared = PreparedStep(run=lambda: None, model=model, x=x)

    def run() -> None:
        prepared.last_output[0] = step()

    prepared.run = run
    return prepared


def capture_step(step: Callable[[], torch.Tensor], model: MLP, x: torch.Tensor) -> PreparedStep:
    """Capture the same step in a graph (PyTorch's whole-network recipe): warm up on a side stream, drop the
    gradients so backward allocates them from the graph's pool (static buffers a replay overwrites)."""
    warm_on_side_stream(step, GRAPH_WARMUP_STEPS)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    def run() -> None:
        with record_function(GRAPH_RANGE):
            graph.replay()

    return PreparedStep(run=run, model=model, x=x, last_output=[static_out], graph=graph)


def check_results(prepared: PreparedStep, reference: tuple[torch.Tensor, torch.Tensor], variant: Variant,
                  x_before: torch.Tensor) -> tuple[float, float, str]:
    """Errors of the last run's output and gradient against the float64 reference, and why they fail ('' if
    they pass). NaN and Inf fail; so does an input the step changed."""
    err_out = relative_error(prepared.output(), reference[0])
    err_grad = relative_error(prepared.grad(), reference[1])
    if not torch.equal(prepared.x, x_before):
        return err_out, err_grad, "the step changed its input"
    if all(math.isfinite(e) and e <= variant.tolerance for e in (err_out, err_grad)):
        return err_out, err_grad, ""
    return err_out, err_grad, (f"relative error {max(err_out, err_grad):.3g} (output {err_out:.3g}, gradient "
                               f"{err_grad:.3g}) exceeds {variant.tolerance:g}")


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
    teardown_profiler_after_use()  # the next variant is timed after this profile
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
) -> tuple[dict[str, Any], pd.DataFrame | None, pd.DataFrame | None]:
    """Check, time and profile one variant; returns its summary fields and its kernel and op tables (None when
    the check failed: an incorrect variant is neither timed nor profiled)."""
    with variant.matmul_precision(), compile_settings(variant, info):
        prepared = prepare_step(variant, model, x, info)  # also the compilation or the capture
        x_before = prepared.x.clone()
        prepared.poison()
        prepared.run()
        synchronize(info)
        err_out, err_grad, problem = check_results(prepared, reference, variant, x_before)
        errors = {"rel_err_output": err_out, "rel_err_grad": err_grad}
        if problem:
            return {"status": "incorrect", "reason": problem, **errors}, None, None
        allocated, reserved = peak_memory(prepared.run, info)
        timed = measure(prepared.run, replace(timing, energy_span_s=ENERGY_SPAN_S), info)
        synchronize(info)
        *_, problem = check_results(prepared, reference, variant, x_before)  # the last timed call's results
        if problem:
            return {"status": "incorrect", "reason": f"after timing: {problem}", **errors}, None, None
        prof = run_profiler(prepared.run, shape.num_steps, info)
    write_trace(prof, out_dir / trace_name(variant.name))
    stack_lines = write_stacks(prof, out_dir / stacks_name(variant.name), info)
    events = prof.events()
    unlinked = ("graph", GRAPH_LAUNCH) if variant.graph else ("other", "")
    records = device_kernel_records(events, unlinked) if info.gpu_available else cpu_op_records(events)
    kernels = kernel_table(records, shape.num_steps)
    tflops = matmul_flops(shape) / (timed.median_ms / 1e3) / 1e12
    fields: dict[str, Any] = {
        "status": "ok",
        "reason": "",
        "tflops": tflops,
        **errors,
        "max_memory_allocated_bytes": allocated,
        "max_memory_reserved_bytes": reserved,
        **kernel_time_fields(kernels, shape.num_steps, timed.median_ms, info),
        **timed.as_row(),
    }
    log.info("%s: %.3f ms/step, %.1f TFLOP/s, kernel time %.0f%% of the step, rel err %.2g/%.2g, "
             "%d kernel rows, %d stack lines", variant.name, timed.median_ms, tflops,
             100 * fields["kernel_step_share"], err_out, err_grad, len(kernels), stack_lines)
    return fields, kernels, op_table(prof.key_averages())


def kernel_time_fields(kernels: pd.DataFrame, steps: int, step_ms: float, info: DeviceInfo) -> dict[str, Any]:
    """Kernel time per step, its matmul share, and its share of the timed step (host-bound below 80%)."""
    total_us = float(kernels["time_us"].sum()) if not kernels.empty else math.nan
    matmul_us = float(kernels.loc[kernels["category"] == "matmul", "time_us"].sum()) if not kernels.empty else 0.0
    per_step_ms = total_us / steps / 1e3
    # CPU-only runs: op self times include the profiler's own overhead, so a share of the step means nothing.
    share = per_step_ms / step_ms if info.gpu_available and step_ms > 0 else math.nan
    if info.gpu_available and kernels.empty:
        log.warning("the profiler recorded no device kernels: kernel time and host-bound verdict unknown")
    return {
        "profiled_ms_per_step": per_step_ms,
        "matmul_share": matmul_us / total_us if total_us > 0 else math.nan,
        "kernel_step_share": share,
        "host_bound": bool(share < HOST_BOUND_SHARE) if math.isfinite(share) else None,
    }


def _release(variant: Variant, model: MLP, info: DeviceInfo) -> None:
    model.zero_grad(set_to_none=True)
    gc.collect()  # a variant's step closures, bf16 copy and graph (with its memory pool) form reference cycles
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
    variants = _variants(config)
    shape = resolve_shape(config, info)
    if not info.gpu_available:
        log.info("no GPU (%s): CPU activities only; kernel rows are ATen ops' self CPU time", info.reason)
    log.info("MLP dim=%d layers=%d batch=%d, %d profiled steps, on %s (%s)", shape.dim, shape.num_layers,
             shape.batch, shape.num_steps, info.name, info.backend)
    base = {"target": target, "fingerprint": fingerprint, "dim": shape.dim, "num_layers": shape.num_layers,
            "batch": shape.batch, "profiled_steps": shape.num_steps,
            "activities": "CPU,CUDA" if info.gpu_available else "CPU",
            "time_source": "device_kernel" if info.gpu_available else "cpu_op_self",
            "step_matmul_flops": float(matmul_flops(shape))}
    summary: list[dict[str, Any]] = []
    kernel_frames: list[pd.DataFrame] = []
    op_frames: list[pd.DataFrame] = []
    setup = _set_up(shape, info, seed)
    for variant in variants:
        hit = ceilings.matmul(variant.ceiling_dtype) if ceilings is not None else MISS
        ceiling = hit.gbps
        fields, kernels, ops = _profile_one(variant, setup, shape, timing, info, out_dir)
        if kernels is not None and ops is not None:
            fields["pct_of_ceiling"] = pct_of(fields["tflops"], ceiling)
            fields["ceiling_method"] = hit.method
            fields["above_ceiling"] = above_ceiling(fields["tflops"], hit, fields["p90_ms"] / fields["p10_ms"])
            fields["tflop_per_j"] = per_unit(fields["energy_j"], base["step_matmul_flops"] / 1e12)
            common = {"target": target, "fingerprint": fingerprint, "status": "ok", "reason": "",
                      "variant": variant.name}
            kernel_frames.append(kernels.assign(**common, time_source=base["time_source"]))
            op_frames.append(ops.assign(**common))
        summary.append({**base, "variant": variant.name, "ceiling_dtype": variant.ceiling_dtype,
                        "ceiling_tflops": ceiling, "tolerance": variant.tolerance, "trace": trace_name(variant.name),
                        "stacks": stacks_name(variant.name), **fields})
    MLP_KERNELS.write(_records(kernel_frames), out_dir / "kernels.csv")
    MLP_OPS.write(_records(op_frames), out_dir / "ops.csv")
    return MLP_SUMMARY.write(summary, out_dir / "summary.csv")


def _variants(config: Mapping[str, Any]) -> list[Variant]:
    unknown = [v for v in config.get("variants", []) if v not in VARIANTS]
    if unknown:
        raise ValueError(f"mlp.variants: unknown variant(s) {unknown}; expected some of {list(VARIANTS)}")
    return [VARIANTS[name] for name in config.get("variants", list(VARIANTS))]


_Setup = tuple[Any, Any, Any, "tuple[str, str] | None"]


def _set_up(shape: MLPShape, info: DeviceInfo, seed: int) -> _Setup:
    """The model, its input and their float64 reference output, or (None, None, None, why not)."""
    try:
        torch.manual_seed(seed)
        model = MLP(shape.dim, shape.num_layers).to(info.torch_device)
        x = torch.randn(shape.batch, shape.dim, device=info.torch_device)
        return model, x, float64_reference(model, x), None
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
        log.exception("could not set up the MLP")
        return None, None, None, _failure(exc)


def _profile_one(variant: Variant, setup: _Setup, shape: MLPShape, timing: TimingSettings, info: DeviceInfo,
                 out_dir: Path) -> tuple[dict[str, Any], pd.DataFrame | None, pd.DataFrame | None]:
    """One variant's summary fields, with its kernel and op tables when it was profiled. A variant that was
    not (unavailable, failed, incorrect: recorded with its errors, not timed) leaves trace files saying why."""
    model, x, reference, setup_error = setup
    why = variant.unavailable(info)
    kernels = ops = None
    if why or setup_error:
        status, reason = ("skipped", why) if why else setup_error
        fields = {"status": status, "reason": reason}
    else:
        try:
            fields, kernels, ops = profile_variant(variant, model, x, reference, shape, timing, info, out_dir)
        except Exception as exc:  # one broken variant (OOM, no C++ compiler) must not lose the others
            log.exception("variant %s failed", variant.name)
            status, reason = _failure(exc)
            fields = {"status": status, "reason": reason}
        finally:
            _release(variant, model, info)
    if kernels is None or ops is None:
        log.info("%s: %s (%s)", variant.name, fields["status"], fields["reason"])
        write_unprofiled(out_dir, variant.name, fields["status"], fields["reason"])
    return fields, kernels, ops


def _records(frames: list[pd.DataFrame]) -> list[dict[str, Any]]:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True).to_dict("records") if frames else []
