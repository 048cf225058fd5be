"""The benchmarked ops: how their inputs are drawn, their float64 reference, and what they must cost.

``bytes_moved`` is the fewest bytes an implementation must move through device memory (each input
read once, the output written once); achieved GB/s and the percentage of the copy ceiling are
computed from it, so an implementation that moves more (the unfused ``manual`` ones) shows as slower,
never as "more bandwidth".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]

GELU_C1 = 0.79788456  # sqrt(2 / pi), as the study writes it
GELU_C2 = 0.044715


def manual_gelu(x: torch.Tensor) -> torch.Tensor:
    """The study's unfused GeLU: one kernel (and one trip through memory) per operator."""
    import torch

    return 0.5 * x * (1 + torch.tanh(GELU_C1 * (x + GELU_C2 * x * x * x)))


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


@dataclass(frozen=True)
class OpSpec:
    name: str
    n_inputs: int
    ndim: int  # rank of the shapes this op takes (1: vector length; 2: rows x cols)
    bytes_per_element: int  # element-sized transfers the op must make: inputs read + output written
    flops_per_element: int  # counting tanh and exp as one each
    input_scale: float  # inputs are randn * scale: covers GeLU's saturation and realistic logits
    manual: Callable[..., torch.Tensor]

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
        import torch

        rows = inputs[0].shape[0]
        row_elems = max(1, inputs[0][0].numel()) if inputs[0].ndim > 1 else 1
        step = max(1, chunk_elems // row_elems)
        for start in range(0, rows, step):
            part = slice(start, min(rows, start + step))
            xs = [t[part].double() for t in inputs]
            if self.name == "gelu":
                x = xs[0]
                ref = 0.5 * x * (1 + torch.tanh(GELU_C1 * (x + GELU_C2 * x**3)))
            elif self.name == "softmax":
                ref = torch.softmax(xs[0], dim=-1)
            elif self.name == "add":
                ref = xs[0] + xs[1]
            else:  # pragma: no cover - OPS is closed
                raise KeyError(self.name)
            yield part, ref

    def label(self, shape: Shape) -> str:
        return "x".join(str(s) for s in shape)


OPS: dict[str, OpSpec] = {
    "gelu": OpSpec("gelu", n_inputs=1, ndim=1, bytes_per_element=2, flops_per_element=9, input_scale=2.0,
                   manual=manual_gelu),
    "softmax": OpSpec("softmax", n_inputs=1, ndim=2, bytes_per_element=2, flops_per_element=5, input_scale=3.0,
                      manual=manual_softmax),
    "add": OpSpec("add", n_inputs=2, ndim=1, bytes_per_element=3, flops_per_element=1, input_scale=1.0,
                  manual=manual_add),
}


def op_spec(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(OPS)}") from None


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
