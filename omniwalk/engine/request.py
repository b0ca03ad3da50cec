"""The engine's per-request record and the events it streams back.

The engine does not look inside ``state``: each model package keeps its own per-request data
there (prompt ids, media, generated tokens, streaming state, ...). The engine only moves
the request between stages along its ``walk`` and collects ``events``.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_done(self) -> bool:
        return self in (Status.FINISHED, Status.ABORTED, Status.FAILED)


@dataclass
class Event:
    """One piece of output: ``kind`` is "text", "audio", "finished" or "error"."""

    kind: str
    data: Any = None


_counter = itertools.count()


@dataclass
class EngineRequest:
    id: str
    walk: tuple[str, ...]  # stage names, in the order the request enters them
    state: Any  # model-owned per-request data
    status: Status = Status.WAITING
    error: Exception | None = None
    events: deque[Event] = field(default_factory=deque)
    order: int = field(default_factory=lambda: next(_counter))  # FIFO tie-breaker and preemption age
    cached: dict[str, int] = field(default_factory=dict)  # KV stage -> prompt tokens its prefix pages gave at admission
    created: float = field(default_factory=time.monotonic)
    started: dict[str, float] = field(default_factory=dict)  # stage -> time.monotonic() its first work launched

    def stage_starts(self) -> dict[str, float]:
        """Seconds from the request's creation to its first work in each stage it reached."""
        return {stage: at - self.created for stage, at in self.started.items()}

    def emit(self, kind: str, data: Any = None) -> None:
        self.events.append(Event(kind, data))

    def fail(self, error: Exception) -> None:
        if not self.status.is_done:
            self.status, self.error = Status.FAILED, error
            self.emit("error", error)

    def guarded(self, fn, *args) -> None:
        """Run ``fn(*args)`` for this request alone; an exception fails this request, no other.

        Programs wrap each request's own post-processing (sampling, stop checks, hand-offs) in it;
        the stage isolates failures of the shared batched forward itself.
        """
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - any error here belongs to this request only
            self.fail(e)


class Work(NamedTuple):
    """A request's share of a stage's batch: ``n`` units (tokens in a KV stage, the program's own
    units in a batch stage: encoder tokens, codec frames)."""

    req: EngineRequest
    n: int


class Chunk(NamedTuple):
    """Tokens [start, start + n) of a request's sequence in one KV-stage forward (``start`` tokens
    are in its KV already: a prefill chunk, or the one token a decode step runs)."""

    req: EngineRequest
    start: int
    n: int
