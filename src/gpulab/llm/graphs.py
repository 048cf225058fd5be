"""Device graphs of a decode step, with the one fall-back that was needed in practice: eager steps.

A step is a list of segments (``fast``: one, the whole step; ``fast_exact``: one per layer), each captured once per
sampling setting after two warm-up steps on a side stream. Graphs are a switch (``llm.graphs``: HIP graphs have
replay bugs on some ROCm releases); a failed compile or capture runs eager steps, the reason in :attr:`Graphs.note`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpulab.core.device import warm_on_side_stream

log = logging.getLogger(__name__)

WARM_STEPS = 2


@dataclass(frozen=True)
class GraphSettings:
    compile: bool
    graphs: bool
    # torch.compile's mode and Inductor options of engine fast's decode step (the tuning sweep's variants,
    # gpulab.llm.tune; the workflow's engines use the defaults).
    compile_mode: str | None = None
    inductor_options: tuple[tuple[str, Any], ...] = ()

    def compile_kwargs(self) -> dict[str, Any]:
        """torch.compile's ``mode`` and ``options`` (it refuses both at once; a variant sets one)."""
        if self.compile_mode:
            return {"mode": self.compile_mode}
        return {"options": dict(self.inductor_options)} if self.inductor_options else {}

    @classmethod
    def resolve(cls, cfg: dict[str, Any], gpu: bool) -> GraphSettings:
        compile_ = gpu if cfg["compile"] == "auto" else bool(cfg["compile"])
        return cls(compile_, gpu and cfg["graphs"] == "auto")


class Graphs:
    """Runs a step's segments, replaying their captured graphs when enabled.

    ``segments(sampling)`` gives the step's callables; the last one's return value is the step's output.
    ``between(i)`` runs eagerly after segment ``i`` (all but the last). ``snapshot``/``restore`` save and put
    back the sequence state around the warm-up steps. ``fallback()`` switches the engine to eager functions.
    """

    def __init__(self, settings: GraphSettings, device: torch.device, segments: Callable[[Any], Sequence[Callable]],
                 between: Callable[[int], None], snapshot: Callable[[], Any], restore: Callable[[Any], None],
                 fallback: Callable[[], None], describe: str) -> None:
        self.settings = settings
        self.enabled = settings.graphs and device.type == "cuda"
        self.segments, self.between, self.snapshot, self.restore = segments, between, snapshot, restore
        self.fallback = fallback
        self.captured: dict[Any, tuple[list[torch.cuda.CUDAGraph], Any]] = {}
        self.warmed: set[Any] = set()
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None
        self.note = ""
        self.mode = describe if self.enabled else "off (llm.graphs: off, or no GPU)"

    def eager(self, sampling: Any) -> Any:
        segments = self.segments(sampling)
        out = None
        for i, segment in enumerate(segments):
            out = segment()
            if i < len(segments) - 1:
                self.between(i)
        return out

    def _warm(self, sampling: Any) -> None:
        saved = self.snapshot()
        if self.enabled:
            warm_on_side_stream(lambda: self.eager(sampling), WARM_STEPS)
        else:
            for _ in range(WARM_STEPS):
                self.eager(sampling)
        self.restore(saved)

    def _capture(self, sampling: Any) -> tuple[list[torch.cuda.CUDAGraph], Any]:
        graphs, out = [], None
        for segment in self.segments(sampling):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = segment()
            graphs.append(graph)
        torch.cuda.synchronize()
        return graphs, out

    @torch.no_grad()
    def prepare(self, sampling: Any) -> None:
        """Compile and capture for ``sampling`` now, so no measured call pays for it."""
        if sampling in self.warmed or not (self.enabled or self.settings.compile):
            return
        try:
            start = time.perf_counter()
            self._warm(sampling)
            warmed = time.perf_counter()
            if self.enabled:
                self.captured[sampling] = self._capture(sampling)
            log.info("step for %s: warm-up (compiling) %.1f s, capture %.1f s", sampling, warmed - start,
                     time.perf_counter() - warmed)
        except Exception as exc:  # an inductor, Triton or capture failure must not lose the measurement
            self.note = f"compile/capture failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})"
            log.warning("%s; running eager steps", self.note)
            if self.enabled:
                torch.cuda.synchronize()
            self.enabled, self.captured = False, {}
            self.mode = f"off: {self.note}"
            self.fallback()
        self.warmed.add(sampling)

    def run(self, sampling: Any) -> Any:
        self.prepare(sampling)
        if not self.enabled:
            return self.eager(sampling)
        graphs, out = self.captured[sampling]
        for i, graph in enumerate(graphs):
            graph.replay()
            if i < len(graphs) - 1:
                self.between(i)
        return out


class LengthGraphs:
    """Device graphs per input length of ``fn(ids, cut)`` (ids ``(1, T)``; its output is consumed before the next
    call): engine ``fast``'s prefill. Its 28 compiled layer calls cost the H100's host 2.5 to 15 ms a 512-token
    prompt, varying from host to host (Dynamo's guards, the dynamic-shape wrapper), beside 12 ms of kernels;
    replayed, a prompt of a length met before costs its kernels only. A new length runs ``WARM_STEPS`` times on
    a side stream, then is captured (so it is slower once, as a first call is anyway); a failing capture turns
    the graphs off for good, the reason in :attr:`mode`.

    ``fn`` may call ``cut()`` where one graph should end and the next begin: launching a graph of a whole prompt
    took the H100's host about 0.5 ms, during which the device waited, so a short first graph lets the device
    start while the host launches the rest (``cut`` does nothing when ``fn`` runs uncaptured).
    """

    def __init__(self, fn: Callable[[torch.Tensor, Callable[[], None]], torch.Tensor], enabled: bool) -> None:
        self.fn, self.enabled = fn, enabled
        self.captured: dict[int, tuple[list[torch.cuda.CUDAGraph], torch.Tensor, torch.Tensor]] = {}
        self.mode = "device graphs per prompt length" if enabled else "no device graphs"

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return self.fn(ids, _no_cut)
        length = int(ids.shape[-1])
        if length not in self.captured:
            try:
                self.captured[length] = self._capture(ids)
            except Exception as exc:  # a capture failure must not lose the measurement
                torch.cuda.synchronize()
                self.enabled, self.captured = False, {}
                self.mode = f"no device graphs: capture failed ({type(exc).__name__}: {str(exc)[:160]})"
                log.warning("prefill %s", self.mode)
                return self.fn(ids, _no_cut)
        graphs, static_ids, out = self.captured[length]
        static_ids.copy_(ids)
        for graph in graphs:
            graph.replay()
        return out

    def _capture(self, ids: torch.Tensor) -> tuple[list[torch.cuda.CUDAGraph], torch.Tensor, torch.Tensor]:
        static_ids = ids.clone()
        start = time.perf_counter()
        warm_on_side_stream(lambda: self.fn(static_ids, _no_cut), WARM_STEPS)
        warmed = time.perf_counter()
        graphs = [torch.cuda.CUDAGraph()]
        pool = torch.cuda.graph_pool_handle()

        def cut() -> None:  # the graphs share one memory pool, so a later one reads what an earlier one wrote
            graphs[-1].capture_end()
            graphs.append(torch.cuda.CUDAGraph())
            graphs[-1].capture_begin(pool=pool)

        torch.cuda.synchronize()
        with torch.cuda.stream(torch.cuda.Stream()):  # capturing needs a stream other than the default one
            graphs[0].capture_begin(pool=pool)
            try:
                out = self.fn(static_ids, cut)
            finally:
                graphs[-1].capture_end()
        torch.cuda.synchronize()
        captured = time.perf_counter()
        for graph in graphs:  # once more, to tell what the replays cost the host from what they cost the device
            graph.replay()
        launched = time.perf_counter()
        torch.cuda.synchronize()
        log.info("prefill of %d tokens: warm-up (compiling) %.1f s, capture %.1f s; its %d graphs launch in %.0f us "
                 "on the host and are done %.2f ms after the call", ids.shape[-1], warmed - start, captured - warmed,
                 len(graphs), (launched - captured) * 1e6, (time.perf_counter() - captured) * 1e3)
        return graphs, static_ids, out


def _no_cut() -> None:
    """Uncaptured, a prefill has no graphs to cut."""
