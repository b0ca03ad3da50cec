"""Launched work not yet completed: one engine step of lookahead.

A stage's ``step`` launches the work of step N+1 before its ``finish`` completes step N (waits for
that step's host read, commits what was read). So while the host reads and commits step N, and
schedules and launches step N+2, the device is busy with step N+1. A program feeds what step N
produced (sampled ids, frames) to step N+1 on the device, without the host knowing it; the host
learns it one step late, and what step N+1 did for a request that step N ended (a stop token, a
codec EOS) is dropped at its completion (its KV goes with the request's pages).

``complete`` finishes every step's work but the newest, or all of it when the newest step
launched nothing (nothing left to overlap with: the last results must come out).

A launch may hold back part of its work until the step before it is committed (``Deferred``: a
grammar's bitmask needs the request's last token on the host). The forward goes first; the rest
launches right after ``complete`` commits that step, while the device still runs the forward.

Every stage launches on its device's current stream, so what a stage launches is ordered after
what the stages before it launched, and a request's inputs need no event between stages. Stages
overlap only through the lookahead above. NOTE: per-stage CUDA streams with events on the data
edges hang the server (the speech stage's host read of a frame can wait forever for its event), so
they are not used.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from omniwalk.engine.request import EngineRequest, Work

Items = list[Work]


@dataclass
class Deferred:
    """What a program's ``run`` returns when part of its launch needs the step before committed."""

    launch: Callable[[], None]  # launches the rest (after the previous step's commits)
    done: Callable[[], None]  # as a plain return value: waits for the host read and commits


@dataclass
class Launch:
    items: Items  # (request, units of work) it carried
    done: Callable[[], None] | None  # waits for its host read and commits; None: nothing to complete
    then: Callable[[], None] | None = None  # the deferred rest of the launch, not yet launched


class InFlight:
    def __init__(self, stage: str, device="cpu"):
        self.stage = stage
        self.device = torch.device(device)
        self.steps: deque[list[Launch]] = deque()

    def launching(self):
        """Context in which the stage's kernels are launched and completed: its device made current
        (Triton kernels and CUDA graph captures use the current device, so a stage placed on another
        GPU than the one before it must not launch there)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def begin_step(self) -> None:
        self.steps.append([])

    def launch(self, items: Items, run: Callable[[Items], Callable | None], remove) -> None:
        """Launch ``run(items)``. If it raises, each item is launched alone and only those that fail
        alone fail (``run`` must leave request state untouched when it raises). A request's first
        launch in the stage is its start there (``EngineRequest.started``)."""
        now = time.monotonic()
        for item in items:
            item[0].started.setdefault(self.stage, now)
        try:
            self.add(items, run(items))
        except Exception:
            for item in items:
                try:
                    self.add([item], run([item]))
                except Exception as e:  # noqa: BLE001 - any model error fails just this request
                    item[0].fail(e)
                    remove(item[0])

    def add(self, items: Items, done: Callable[[], None] | Deferred | None) -> None:
        """A launch of this step; one with nothing to complete has made its outputs visible already."""
        if isinstance(done, Deferred):
            self.steps[-1].append(Launch(items, done.done, done.launch))
        else:
            self.steps[-1].append(Launch(items, done))

    @property
    def is_empty(self) -> bool:
        return not any(self.steps)

    def complete(self, remove: Callable[[EngineRequest], None]) -> None:
        """Complete every launch of the steps before the newest (all of them if the newest launched
        nothing). A completion that raises fails the requests it carried (``remove`` takes them out)."""
        keep = 1 if self.steps and self.steps[-1] else 0
        while len(self.steps) > keep:
            for launch in self.steps.popleft():
                _run(launch, "then", remove)
                _run(launch, "done", remove)
        for launch in self.steps[-1] if self.steps else ():  # the newest step's deferred rest, now its turn
            _run(launch, "then", remove)


def _run(launch: Launch, part: str, remove: Callable[[EngineRequest], None]) -> None:
    """Run ``launch.then`` or ``launch.done`` once (if set). If it raises, the requests it carried fail
    and nothing more of it runs."""
    fn = getattr(launch, part)
    if fn is None:
        return
    launch.then = None if part == "then" else launch.then
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a failed launch or read fails the requests it carried
        launch.done = None
        for req, _ in launch.items:
            req.fail(e)
            remove(req)
