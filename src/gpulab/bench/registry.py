"""The implementations of the ops: each a decorated factory returning a zero-argument closure, so that only the
op's launch is timed (loading, compiling and ``out=`` allocation happen in the factory).

``writes_out=True`` implementations get the correctness gate's poisoned buffer as ``out``. An implementation is
registered for one op (``register``) or, with its :class:`Implementation` facts, for every op (``register_kind``:
the five of :mod:`gpulab.bench.impls`); the op-specific one wins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpulab.core.device import DeviceInfo
from gpulab.core.ops import OPS

if TYPE_CHECKING:
    import torch

Factory = Callable[["Case", Sequence["torch.Tensor"], "torch.Tensor | None"], Callable[[], "torch.Tensor"]]
# Why an implementation cannot run in this context, or None when it can.
Availability = Callable[["BenchContext"], "Unavailable | None"]
# The same for an implementation of every op, told which op it is asked about.
OpAvailability = Callable[["BenchContext", str], "Unavailable | None"]
# Compiles what a cell's cases will launch on the probed device, CPU-only, before its job claims the device
# (gpulab.core.device_lock): the compiler then runs while another job measures.
Ahead = Callable[[Sequence["Case"], DeviceInfo], None]

BASELINE = "native"
# What an implementation is to an op's performance goal: nothing, held to it, or one of those it is held against.
GOAL_ROLES = ("", "held", "reference")


@dataclass(frozen=True)
class Implementation:
    """The facts of one implementation of every op that the workflow, the tables and the report ask."""

    name: str
    row_order: int  # its place in the aggregated tables: the baseline first, then by how far from PyTorch
    colour: int  # its palette slot in every figure (the baseline in the most neutral)
    needs_extension: bool = False  # its cells load the C++ library the build step's manifest names
    needs_inductor: bool = False  # its cells start torch.compile's Inductor compile workers first
    runs_triton_kernels: bool = False  # its cells run the op's Triton kernel module (their code: its files)
    goal: str = ""  # held: it is held to the op's goal (gpulab.core.ops.Goal); reference: the best of these sets it
    study: tuple[str, float] | None = None  # the lecture's name of it and its ms on GeLU at 2^28 fp32 elements

    def __post_init__(self) -> None:
        if self.goal not in GOAL_ROLES:
            raise ValueError(f"implementation {self.name!r}: goal {self.goal!r} is not one of {GOAL_ROLES}")


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
    ahead: Ahead | None = None

    def unavailable(self, ctx: BenchContext) -> Unavailable | None:
        return self.availability(ctx) if self.availability else None


class Registry:
    def __init__(self) -> None:
        self._impls: dict[tuple[str, str], Impl] = {}
        self._kinds: dict[str, tuple[Impl, OpAvailability | None]] = {}
        self._facts: dict[str, Implementation] = {}

    def register(
        self, op: str, name: str, *, writes_out: bool = False, availability: Availability | None = None
    ) -> Callable[[Factory], Factory]:
        """An implementation of one op."""
        def decorate(factory: Factory) -> Factory:
            key = (op, name)
            if key in self._impls:
                raise ValueError(f"implementation {name!r} of {op!r} is already registered")
            self._impls[key] = Impl(op, name, factory, writes_out, availability, _first_line(factory))
            return factory

        return decorate

    def register_kind(
        self, facts: Implementation, *, writes_out: bool = False, availability: OpAvailability | None = None,
        ahead: Ahead | None = None,
    ) -> Callable[[Factory], Factory]:
        """An implementation of every registered op, built from the op's entry (``case.op``), with its facts."""
        name = facts.name

        def decorate(factory: Factory) -> Factory:
            if name in self._kinds:
                raise ValueError(f"implementation kind {name!r} is already registered")
            self._kinds[name] = (Impl("", name, factory, writes_out, None, _first_line(factory), ahead), availability)
            self._facts[name] = facts
            return factory

        return decorate

    def get(self, op: str, name: str) -> Impl:
        if (op, name) in self._impls:
            return self._impls[(op, name)]
        if name in self._kinds and op in OPS:
            impl, availability = self._kinds[name]
            return replace(impl, op=op, availability=functools.partial(availability, op=op) if availability else None)
        known = ", ".join(self.impls(op)) or "none"
        raise KeyError(f"no implementation {name!r} of op {op!r} is registered (known: {known})")

    def impls(self, op: str) -> list[str]:
        kinds = list(self._kinds) if op in OPS else []
        return list(dict.fromkeys([*kinds, *(name for (o, name) in self._impls if o == op)]))

    def kinds(self) -> list[str]:
        """The implementations every op has."""
        return list(self._kinds)

    def implementations(self) -> list[Implementation]:
        """The facts of the implementations every op has, in registration order."""
        return list(self._facts.values())

    def implementation(self, name: str) -> Implementation | None:
        """The facts of one implementation every op has; None for an op-specific one."""
        return self._facts.get(name)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._impls or (key[1] in self._kinds and key[0] in OPS)


def _first_line(factory: Factory) -> str:
    doc = (factory.__doc__ or "").strip().splitlines()
    return doc[0] if doc else ""


REGISTRY = Registry()
register = REGISTRY.register
register_kind = REGISTRY.register_kind
