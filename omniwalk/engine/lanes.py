"""Where a stage launches its work, with per-request stamps on the data edges.

Every stage launches through its ``Lane``. The data edges are per request: when a stage's outputs
for a request become visible to the stages after it, the stage stamps the request with an event
(``EngineRequest.produced``); a stage about to launch a batch waits for the stamps of the stages
before it on each request's walk (``num_waits`` counts the edges crossed, for tests).

NOTE: all lanes launch on the device's current stream, so the stamps are already passed. Lanes on
CUDA streams of their own (one per stage, events on the edges) hung a server on the H200
(2026-12-01, `benchmarks/results/2026-12-01-h200/integration/`): the speech stage's host read of a frame
waited forever for its event, at a different step each run, while the same tree on one stream
served every path with 0 errors. Until that is understood, stages overlap only through the
engine's one-step lookahead, not on separate streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch


class Lane:
    def __init__(self, device):
        self.device = torch.device(device)
        self.num_waits = 0  # distinct events waited for (the data edges crossed), for tests

    def launching(self):
        """Context in which the stage's kernels are launched: its device's current stream (see the
        NOTE), with its device made current (Triton kernels, events and CUDA graph captures use the
        current device: a stage placed on another GPU than the one before it must not launch there)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def record(self):
        """A stamp after everything launched on this lane so far: passed, on one stream."""
        return PASSED

    def wait_for(self, events: Iterable) -> None:
        """Later launches on this lane start after ``events`` (each counted once; on one stream
        they are passed already)."""
        self.num_waits += len({id(e) for e in events if e is not None})


PASSED = object()  # a stamp that is passed already (one stream, or the host)


def upstream_events(req, stage: str) -> list:
    """The stamps of the stages before ``stage`` on ``req``'s walk (what its inputs came from)."""
    before = req.walk[: req.walk.index(stage)] if stage in req.walk else ()
    return [req.produced.get(name) for name in before]
