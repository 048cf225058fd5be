"""A clock that moves only when told: timing tests drive it, never the machine's (a loaded machine's speed then
cannot change what they measure)."""

from __future__ import annotations

import types

import pytest


class FakeClock:
    """``perf_counter``/``monotonic`` read it, ``sleep`` and :meth:`advance` move it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def module(self) -> types.SimpleNamespace:
        """A stand-in for the ``time`` module of the code under test."""
        return types.SimpleNamespace(perf_counter=lambda: self.now, monotonic=lambda: self.now,
                                     sleep=lambda s: self.advance(max(0.0, s)))


def install(monkeypatch: pytest.MonkeyPatch, *modules: object) -> FakeClock:
    """One fake clock as the ``time`` of each of ``modules``."""
    clock = FakeClock()
    for module in modules:
        monkeypatch.setattr(module, "time", clock.module())
    return clock
