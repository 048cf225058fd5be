"""One registry of implementations per op: adding an implementation is one decorated function.

A factory takes a :class:`Case` and the case's input tensors (already on the device) and returns a
zero-argument closure that runs the op once and returns its output. Everything that is not the op
itself (compilation wrappers, extension loading, output allocation for ``out=`` variants) happens in
the factory, outside the timed region. ``out`` is a preallocated output the closure must write into,
or None: implementations registered with ``writes_out=True`` receive the correctness gate's poisoned
buffer there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulab.device import DeviceInfo

if TYPE_CHECKING:
    import torch

Factory = Callable[["Case", Sequence["torch.Tensor"], "torch.Tensor | None"], Callable[[], "torch.Tensor"]]
# Why an implementation cannot run in this context, or None when it can.
Availability = Callable[["BenchContext"], "Unavailable | None"]

BASELINE = "native"


@dataclass(frozen=True)
class Unavailable:
    """An implementation that cannot run here: ``skipped`` (missing hardware or tool) or ``failed``
    (the tool is there but, e.g., the build broke), with the reason recorded on every row."""

    reason: str
    status: str = "skipped"


@dataclass(frozen=True)
class Case:
    op: str
    impl: str
    shape: tuple[int, ...]
    dtype: str  # fp32 | fp16 | bf16
    device: str  # torch device string

    @property
    def label(self) -> str:
        return "x".join(str(s) for s in self.shape)


@dataclass
class BenchContext:
    """What availability checks and factories may need beyond the case: the device and the target."""

    info: DeviceInfo
    target: str
    # Filled by availability checks that load something once per job (e.g. the extension's ops).
    cache: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Impl:
    op: str
    name: str
    factory: Factory
    writes_out: bool = False
    availability: Availability | None = None
    description: str = ""

    def unavailable(self, ctx: BenchContext) -> Unavailable | None:
        return self.availability(ctx) if self.availability else None


class Registry:
    def __init__(self) -> None:
        self._impls: dict[tuple[str, str], Impl] = {}

    def register(
        self, op: str, name: str, *, writes_out: bool = False, availability: Availability | None = None
    ) -> Callable[[Factory], Factory]:
        def decorate(factory: Factory) -> Factory:
            key = (op, name)
            if key in self._impls:
                raise ValueError(f"implementation {name!r} of {op!r} is already registered")
            doc = (factory.__doc__ or "").strip().splitlines()
            self._impls[key] = Impl(op, name, factory, writes_out, availability, doc[0] if doc else "")
            return factory

        return decorate

    def get(self, op: str, name: str) -> Impl:
        try:
            return self._impls[(op, name)]
        except KeyError:
            known = ", ".join(self.impls(op)) or "none"
            raise KeyError(f"no implementation {name!r} of op {op!r} is registered (known: {known})") from None

    def impls(self, op: str) -> list[str]:
        return [name for (o, name) in self._impls if o == op]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._impls


REGISTRY = Registry()
register = REGISTRY.register
