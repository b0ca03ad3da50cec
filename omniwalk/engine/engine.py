"""The walk runtime: requests move through a model's stages; one ``step`` advances every stage.

A request is added to every stage of its walk at once; a stage runs a request's work only when
the model program says its inputs are ready (encoder outputs present, enough text tokens for a
speech LM, enough frames for a vocoder), so streaming edges need no extra machinery. A
request is finished when every stage of its walk is done with it; aborting or failing a request
removes it from every stage, freeing its KV pages and stage state at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from omniwalk.engine.inflight import InFlight
from omniwalk.engine.request import EngineRequest, Status
from omniwalk.errors import OmniwalkError


class QueueFullError(OmniwalkError):
    """The engine holds ``max_requests`` unfinished requests; retry later."""


@dataclass(frozen=True)
class EngineLimits:
    max_requests: int = 256  # unfinished requests admitted (queued + running); beyond: QueueFullError


class Stage(Protocol):
    name: str

    def add(self, req: EngineRequest) -> None: ...

    def remove(self, req: EngineRequest) -> None: ...

    def is_done(self, req: EngineRequest) -> bool: ...

    def step(self) -> bool: ...

    def finish(self) -> None: ...

    inflight: InFlight  # launched work not yet completed, and the device it launches on (engine/inflight.py)

    def stats(self) -> dict: ...

    def capture_graphs(self, pool=None): ...


class Engine:
    def __init__(self, stages: list[Stage], limits: EngineLimits = EngineLimits()):
        self.stages = {s.name: s for s in stages}  # insertion order = step order (upstream first)
        self.limits = limits
        self.requests: dict[str, EngineRequest] = {}

    def add(self, req: EngineRequest) -> None:
        if req.id in self.requests:
            raise ValueError(f"request id {req.id!r} is already running")
        if len(self.requests) >= self.limits.max_requests:
            raise QueueFullError(f"engine is full ({self.limits.max_requests} unfinished requests)")
        unknown = [s for s in req.walk if s not in self.stages]
        if unknown:
            raise ValueError(f"walk names unknown stages {unknown}")
        self.requests[req.id] = req
        for name in req.walk:
            self.stages[name].add(req)

    def abort(self, request_id: str) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self._remove_everywhere(req)
        req.status = Status.ABORTED
        req.emit("finished", "abort")
        return True

    def step(self) -> bool:
        """Advance every stage once; returns whether any stage launched work.

        Upstream first, each stage launches its next batch (on its device's current stream), then
        completes the batch it launched one step before (waits for that batch's host read and
        commits it; ``engine/inflight.py``). So the device always has a step queued while the
        host reads, commits and schedules, and a stage sees what the stages before it committed
        in this step.
        """
        worked = False
        for stage in self.stages.values():
            worked |= stage.step()
            stage.finish()
        self._retire()
        return worked

    def drain(self) -> None:
        """Complete all launched work now (every stage's reads and commits), launching nothing."""
        for stage in self.stages.values():
            stage.inflight.begin_step()
            stage.finish()
        self._retire()

    def _retire(self) -> None:
        for req in list(self.requests.values()):
            if req.status is Status.FAILED:
                self._remove_everywhere(req)
                del self.requests[req.id]
            elif all(self.stages[name].is_done(req) for name in req.walk):
                self._remove_everywhere(req)  # (from a stage done with it that has not swept it yet)
                req.status = Status.FINISHED
                del self.requests[req.id]
                req.emit("finished")

    def capture_graphs(self) -> dict[str, float]:
        """Let every stage that has them capture its CUDA graphs, one memory pool per stage (stages
        share their device's current stream, ``engine/inflight.py``, so one pool would also do).
        -> seconds per stage (Triton's compiles in the first warm-ups included)."""
        seconds = {}
        for name, stage in self.stages.items():
            start = time.perf_counter()
            with stage.inflight.launching():  # (each stage's graphs on its own device)
                stage.capture_graphs(None)
            seconds[name] = time.perf_counter() - start
        return seconds

    def stats(self) -> dict[str, dict]:
        """Per stage: occupancy and the last batch size; plus the engine's request count."""
        out = {name: stage.stats() for name, stage in self.stages.items()}
        out["engine"] = {"requests": len(self.requests)}
        return out

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def _remove_everywhere(self, req: EngineRequest) -> None:
        for name in req.walk:
            self.stages[name].remove(req)
