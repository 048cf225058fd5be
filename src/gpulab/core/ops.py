"""The op registry: the one definition of each benchmarked op, which every step, the compile table, the tuning
sweep, the extension's checks, the config schema and the report ask.

An op is one :class:`OpSpec` given to :func:`register_op` (formula, float64 reference, the study's ``manual``,
PyTorch's ``native``, fewest bytes, access pattern, extension op, Triton module, inputs, title, goal) and its
kernel files; :func:`check` compares an output with the reference. See docs/extending.md.
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpulab.core.patterns import MEMORY_PATTERNS

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]

GELU_C1 = 0.79788456  # sqrt(2 / pi), as the study writes it
GELU_C2 = 0.044715


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GeLU, tanh approximation, in the dtype of ``x``: the one place its formula is written.

    As the study's manual_gelu: unfused, one kernel (and one trip through memory) per operator.
    """
    import torch

    return 0.5 * x * (1 + torch.tanh(GELU_C1 * (x + GELU_C2 * x * x * x)))


manual_gelu = gelu_tanh


def manual_softmax(x: torch.Tensor) -> torch.Tensor:
    """The study's five-pass softmax over rows: max, subtract, exp, sum, divide."""
    import torch

    x_max = x.max(dim=1, keepdim=True)[0]
    x_shifted = x - x_max
    numerator = torch.exp(x_shifted)
    denominator = numerator.sum(dim=1, keepdim=True)
    return numerator / denominator


def manual_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Vector add left unfused: copy one operand, then accumulate the other into it (two passes)."""
    out = a.clone()
    out.add_(b)
    return out


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.softmax(x, dim=-1)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def native_gelu() -> Callable[..., torch.Tensor]:
    import torch.nn.functional as F

    return functools.partial(F.gelu, approximate="tanh")


def native_softmax() -> Callable[..., torch.Tensor]:
    import torch

    return functools.partial(torch.softmax, dim=-1)


def native_add() -> Callable[..., torch.Tensor]:
    return operator.add


@dataclass(frozen=True)
class Goal:
    """A performance goal of an op's Triton and C++ kernels (set for an H100): ``pct`` of the pattern's measured
    ceiling at the named shapes and dtypes, or, where none are named, at input tensors of ``min_bytes`` and more;
    and at most GOAL_SLOWDOWN slower than the best of native and torch_compile (gpulab.report.sections.bench)."""

    pct: float
    shapes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    min_bytes: int = 256 * 2**20


# Where an op's Triton kernels live unless its entry names another module (its wrapper is the module's <op>).
TRITON_KERNELS = "gpulab.kernels.triton.{op}"


@dataclass(frozen=True)
class OpSpec:
    name: str
    title: str  # how the report names it
    formula: str
    pattern: str  # memory-access pattern of its ceiling (gpulab.core.patterns): copy | add | read
    n_inputs: int
    ndim: int  # rank of the shapes this op takes (1: vector length; 2: rows x cols)
    bytes_per_element: int  # element-sized transfers the op must make: inputs read + output written
    flops_per_element: int  # counting tanh and exp as one each
    input_scale: float  # inputs are randn * scale: covers GeLU's saturation and realistic logits
    exact: Callable[..., torch.Tensor]  # the op on float64 inputs: the reference
    manual: Callable[..., torch.Tensor]  # the study's unfused PyTorch (torch_compile compiles it)
    native: Callable[[], Callable[..., torch.Tensor]]  # PyTorch's fused op, looked up outside the timed call
    ext_op: str | None = None  # torch.ops.gpulab.<ext_op> in the C++ extension, if it has the op
    triton: str | None = TRITON_KERNELS  # its Triton kernel module ({op}: the op's name), if it has one
    goal: Goal | None = None
    kernel_atol: float | None = None  # the fused kernels' absolute slack where KERNEL_TOLERANCES' would hide errors

    @property
    def triton_module(self) -> str | None:
        return self.triton.format(op=self.name) if self.triton else None

    def triton_kernels(self) -> ModuleType:
        """The op's Triton kernel module (imports Triton)."""
        if not self.triton_module:
            raise ValueError(f"op {self.name!r} has no Triton kernels")
        return importlib.import_module(self.triton_module)

    def numel(self, shape: Shape) -> int:
        return math.prod(shape)

    def bytes_moved(self, shape: Shape, itemsize: int) -> int:
        return self.bytes_per_element * self.numel(shape) * itemsize

    def flops(self, shape: Shape) -> int:
        return self.flops_per_element * self.numel(shape)

    def make_inputs(self, shape: Shape, dtype: torch.dtype, device: str, seed: int) -> list[torch.Tensor]:
        """Fresh random inputs (never zeros) of the tested dtype, drawn on the device."""
        import torch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        out = []
        for _ in range(self.n_inputs):
            t = torch.randn(shape, device=device, dtype=torch.float32, generator=gen)
            t.mul_(self.input_scale)
            out.append(t.to(dtype))
        return out

    def reference_chunks(
        self, inputs: Sequence[torch.Tensor], chunk_elems: int
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """float64 reference of the op on the (already rounded) inputs, in chunks of whole rows,
        so multi-GiB cases do not need a float64 copy of the whole tensor at once."""

        rows = inputs[0].shape[0]
        row_elems = max(1, inputs[0][0].numel()) if inputs[0].ndim > 1 else 1
        step = max(1, chunk_elems // row_elems)
        for start in range(0, rows, step):
            part = slice(start, min(rows, start + step))
            yield part, self.exact(*(t[part].double() for t in inputs))

    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        """float64 reference of the op on (the float64 values of) ``inputs``."""
        return self.exact(*(t.double() for t in inputs))

    def label(self, shape: Shape) -> str:
        return "x".join(str(s) for s in shape)


OPS: dict[str, OpSpec] = {}


def register_op(spec: OpSpec) -> OpSpec:
    """Add an op to the registry: the matrix, the compile table, the tuning sweep, the config and the report
    then know it."""
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} is already registered")
    if spec.pattern not in MEMORY_PATTERNS:
        raise ValueError(f"op {spec.name!r}: pattern {spec.pattern!r} is not one of {', '.join(MEMORY_PATTERNS)}")
    OPS[spec.name] = spec
    return spec


register_op(OpSpec(
    "gelu", "GeLU (tanh approximation)", f"0.5 x (1 + tanh({GELU_C1} (x + {GELU_C2} x^3)))", "copy", n_inputs=1,
    ndim=1, bytes_per_element=2, flops_per_element=9, input_scale=2.0, exact=gelu_tanh, manual=manual_gelu,
    native=native_gelu, ext_op="gelu_tanh", goal=Goal(90.0)))
register_op(OpSpec(
    "softmax", "Softmax over the rows of a 2-D tensor", "exp(x - max(x)) / sum(exp(x - max(x))) over each row",
    "copy", n_inputs=1, ndim=2, bytes_per_element=2, flops_per_element=5, input_scale=3.0, exact=softmax_rows,
    manual=manual_softmax, native=native_softmax, ext_op="softmax_rows", kernel_atol=1e-7,
    goal=Goal(85.0, shapes=("16384x1024", "4096x16384", "65536x256"), dtypes=("fp32", "bf16"))))
register_op(OpSpec(
    "add", "Vector add", "a + b", "add", n_inputs=2, ndim=1, bytes_per_element=3, flops_per_element=1,
    input_scale=1.0, exact=add, manual=manual_add, native=native_add, ext_op="vector_add", goal=Goal(90.0)))


def triton_kernels() -> dict[str, ModuleType]:
    """Every registered op's Triton kernel module, by op (imports Triton)."""
    return {name: spec.triton_kernels() for name, spec in OPS.items() if spec.triton_module}


def size_schema(spec: OpSpec) -> dict[str, Any]:
    """The config schema of one op's ``bench.sizes`` list: element counts, or [rows, cols] pairs."""
    count = {"$ref": "#/$defs/positive_int"}
    item = count if spec.ndim == 1 else {"type": "array", "minItems": spec.ndim, "maxItems": spec.ndim,
                                         "items": count}
    return {"type": "array", "minItems": 1, "items": item}


def op_spec(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(OPS)}") from None


def by_ext_op(ext_op: str) -> OpSpec:
    """The op the C++ extension calls ``ext_op`` (``torch.ops.gpulab.<ext_op>``)."""
    for spec in OPS.values():
        if spec.ext_op == ext_op:
            return spec
    known = ", ".join(s.ext_op for s in OPS.values() if s.ext_op)
    raise ValueError(f"no op is torch.ops.gpulab.{ext_op}; expected one of {known}")


def parse_shape(op: str, value: int | Sequence[int] | str) -> Shape:
    """A size from config or a CSV (``98432``, ``[1823, 781]``, ``"1823x781"``) as a shape of the op's rank."""
    spec = op_spec(op)
    if isinstance(value, str):
        parts = value.lower().split("x")
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"{op}: size {value!r} is not of the form N or ROWSxCOLS") from None
    elif isinstance(value, int):
        shape = (value,)
    else:
        shape = tuple(int(v) for v in value)
    if len(shape) != spec.ndim or any(s < 1 for s in shape):
        want = "a positive element count" if spec.ndim == 1 else "[rows, cols] of positive integers"
        raise ValueError(f"{op}: size {value!r} is not {want}")
    return shape


# ------------------------------------------------------------------------------------------ the check


def _schema_tolerances() -> dict[str, float]:
    from gpulab.core.schema import schema_file

    props = schema_file()["properties"]["bench"]["properties"]["tolerances"]["properties"]
    return {dtype: float(spec["default"]) for dtype, spec in props.items()}


# ||out - ref|| / ||ref||, defaults from the config schema (bench.tolerances). Rounding the exact result
# to the dtype alone gives about 0.6 unit roundoff (fp32 ~4e-8, fp16 ~1.7e-4, bf16 ~1.3e-3 measured); the
# bounds leave room for the unfused implementations' several roundings (manual bf16 GeLU ~1.5e-3 on CPU
# and H100) and fail anything structurally wrong (the erf GeLU instead of the tanh one: ~1e-4 in fp32).
NORM_TOLERANCES = _schema_tolerances()
# Every element must also satisfy |out - ref| <= atol * rms(ref) + rtol * |ref|: a norm bound alone lets a
# few whole wrong softmax rows pass at bf16's 1.6e-2. rtol is about 8 unit roundoffs of the dtype (several
# roundings in the unfused implementations); atol, relative to the reference's RMS (so it means the same
# for softmax probabilities ~1e-3 as for GeLU outputs ~1), covers results near zero whose intermediate
# terms (1 + tanh(..) of GeLU at large negative x) were rounded at magnitude ~1. Calibrated on CPU over
# manual/native/compile at the odd sizes: the worst element used < 1/3 of its bound.
ELEMENT_TOLERANCES: dict[str, tuple[float, float]] = {  # dtype: (atol, rtol)
    "fp32": (1e-6, 2e-5),
    "fp16": (2e-3, 8e-3),
    "bf16": (1.6e-2, 6.4e-2),
}
# (rtol, atol) per dtype of one fused kernel (the C++ extension's): fp32 arithmetic, then one rounding to the output
# dtype (2^-11 fp16, 2^-8 bf16); elementwise |out - ref| <= atol + rtol |ref|.
KERNEL_TOLERANCES = {"fp32": (1e-5, 1e-5), "fp16": (1e-3, 1e-5), "bf16": (8e-3, 1e-5)}
# float64 chunk of the reference (elements): bounds the check's extra memory on multi-GiB cases.
REFERENCE_CHUNK_ELEMS = 1 << 26


@dataclass(frozen=True)
class Check:
    """Outcome of comparing an output with its float64 reference."""

    passed: bool
    rel_err: float  # ||out - ref|| / ||ref||
    max_abs_err: float
    element_ratio: float  # max over elements of |out - ref| / (atol rms(ref) + rtol |ref|): above 1 fails
    nonfinite: int
    tolerance: float
    reason: str = ""


def norm_tolerance(dtype: str, tolerances: Mapping[str, float] | None = None) -> float:
    merged = {**NORM_TOLERANCES, **(tolerances or {})}
    return float(merged[dtype])


def kernel_tolerance(spec: OpSpec, dtype: str) -> tuple[float, float]:
    """(rtol, atol) a fused kernel of the op meets in ``dtype``: softmax outputs are tiny for long rows, so its
    absolute slack is its own."""
    rtol, atol = KERNEL_TOLERANCES[dtype]
    return rtol, atol if spec.kernel_atol is None else spec.kernel_atol


def compare_chunks(chunks: Iterable[tuple[Any, Any]], dtype: str, tolerance: float | None = None) -> Check:
    """Check (output, float64 reference) pairs of one result, chunk by chunk: any NaN/Inf fails, the norm
    error must stay within ``tolerance`` (default: the dtype's) and every element within its bound."""
    import torch

    tolerance = norm_tolerance(dtype) if tolerance is None else tolerance
    atol, rtol = ELEMENT_TOLERANCES[dtype]
    err_sq = ref_sq = max_abs = ratio = 0.0
    nonfinite = numel = 0
    for got, ref in chunks:
        got = got.double()
        numel += got.numel()
        nonfinite += int((~torch.isfinite(got)).sum().item())
        if nonfinite or not got.numel():
            continue
        diff = (got - ref).abs()
        err_sq += float(torch.sum(diff * diff).item())
        ref_sq += float(torch.sum(ref * ref).item())
        max_abs = max(max_abs, float(diff.max().item()))
        scale = max(float(torch.sqrt(torch.mean(ref * ref)).item()), 1e-300)
        ratio = max(ratio, float((diff / (atol * scale + rtol * ref.abs())).max().item()))
    if nonfinite:
        return Check(False, math.nan, math.nan, math.nan, nonfinite, tolerance,
                     f"{nonfinite} of {numel} outputs are not finite (unwritten or overflowed)")
    rel = math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else math.sqrt(err_sq)
    reason = ""
    if not rel <= tolerance:
        reason = f"relative error {rel:.3g} exceeds the {dtype} tolerance {tolerance:.3g}"
    elif not ratio <= 1.0:
        reason = (f"an element is off by {ratio:.3g} times its bound |out - ref| <= {atol:g} rms(ref) + {rtol:g} "
                  f"|ref| ({dtype})")
    return Check(not reason, rel, max_abs, ratio, 0, tolerance, reason)


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: str, tolerance: float | None = None) -> Check:
    """Check one output against a float64 reference computed elsewhere (e.g. a whole model in float64)."""
    return compare_chunks([(out, ref.double())], dtype, tolerance)


def check(op: str, out: torch.Tensor, inputs: Sequence[torch.Tensor], dtype: str, tolerance: float | None = None,
          chunk_elems: int = REFERENCE_CHUNK_ELEMS) -> Check:
    """Check an op's output against its float64 reference on ``inputs``, in chunks of whole rows."""
    spec = op_spec(op)
    return compare_chunks(((out[part], ref) for part, ref in spec.reference_chunks(inputs, chunk_elems)), dtype,
                          tolerance)
