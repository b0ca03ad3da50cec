"""Batching for components without a KV cache (encoders, a streaming vocoder).

Each step packs ready work from every request, oldest first, up to a budget of work units
(encoder tokens, codec frames): **pack what is ready, run it once**. A single unit of work
larger than the budget still runs, alone. Per-request streaming state lives in the
request's model-owned state, so batching never mixes requests' state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omniwalk.engine.inflight import InFlight
from omniwalk.engine.request import EngineRequest, Work


@dataclass(frozen=True)
class BatchStageConfig:
    max_batch_units: int = 4096
    max_batch_requests: int = 64


class BatchProgram:
    """The model side of a batch stage: ``take``, ``run`` and ``is_finished``; the rest have defaults."""

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        """Units of ``req``'s ready work to run in this batch, within ``budget`` unless the batch is
        empty (0 = nothing ready or nothing that fits)."""
        raise NotImplementedError

    def run(self, batch: list[Work]) -> Callable[[], None] | None:
        """Launch the taken work; must leave request state untouched if it raises. May return a
        function that completes it (waits for its host read, commits): the stage calls it one step
        later (``engine/inflight.py``), so ``take`` must count work launched but not completed."""
        raise NotImplementedError

    def is_finished(self, req: EngineRequest) -> bool:
        raise NotImplementedError

    def release(self, req: EngineRequest) -> None:
        """Free what the program holds for a request leaving the stage."""

    def capture_graphs(self, pool=None):
        """Capture CUDA graphs (at start-up); returns the memory pool."""
        return pool

    def stats(self) -> dict:
        """Counters reported beside the stage's own (graph replays, eager calls)."""
        return {}


class BatchStage:
    def __init__(self, name: str, program: BatchProgram, config: BatchStageConfig, device="cpu"):
        self.name, self.program, self.config = name, program, config
        self.requests: dict[str, EngineRequest] = {}
        self.last_batch_size = 0
        self.inflight = InFlight(name, device)  # (also where its work launches: its device)

    def stats(self) -> dict:
        return {"requests": len(self.requests), "batch_size": self.last_batch_size, **self.program.stats()}

    def capture_graphs(self, pool=None):
        return self.program.capture_graphs(pool)

    def add(self, req: EngineRequest) -> None:
        self.requests[req.id] = req

    def remove(self, req: EngineRequest) -> None:
        if self.requests.pop(req.id, None) is not None:
            self.program.release(req)

    def is_done(self, req: EngineRequest) -> bool:
        """Gone, or finished by what a later stage did in this step (an encoder keeps a request whose
        skipped items its thinker may still ask for, until the thinker finishes)."""
        return req.id not in self.requests or self.program.is_finished(req)

    def schedule(self) -> list[Work]:
        batch, budget = [], self.config.max_batch_units
        for req in sorted(self.requests.values(), key=lambda r: r.order):
            if len(batch) >= self.config.max_batch_requests or budget <= 0:
                break
            units = self.program.take(req, budget, not batch)
            if units:
                batch.append(Work(req, units))
                budget -= units
        return batch

    def step(self) -> bool:
        """Launch this step's batch on the stage's device (``finish`` completes the step before it);
        returns whether any work was launched."""
        self.inflight.begin_step()
        with self.inflight.launching():
            self._sweep()
            batch = self.schedule()
            self.last_batch_size = len(batch)
            if batch:
                self.inflight.launch(batch, self.program.run, self.remove)
        return bool(batch)

    def finish(self) -> None:
        """Complete the previous step's batch (host reads and commits; all launched work when this
        step launched none), then drop finished requests."""
        with self.inflight.launching():
            self.inflight.complete(self.remove)
        self._sweep()

    def _sweep(self) -> None:
        """Drop finished requests (some finish without work here, e.g. a speech stream that ended)."""
        for req in [r for r in self.requests.values() if r.status.is_done or self.program.is_finished(r)]:
            self.remove(req)
