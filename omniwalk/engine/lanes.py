"""Where a stage launches its work: its own CUDA stream, with events on the data edges.

Every stage launches on its own ``Lane`` (a CUDA stream on CUDA), so the thinker, the talker, the
vocoder and the encoders of one engine step can run at the same time on one GPU: a step costs about
its longest stage, not their sum, where kernels leave the GPU partly idle.

The data edges are per request. When a stage's outputs for a request become visible to the stages
after it (at launch for a program that has nothing to complete, e.g. an encoder writing its rows;
else when its launch completes, e.g. the thinker's committed tokens), the stage stamps the request
with the event recorded after that launch (``EngineRequest.produced``). A stage about to launch a
batch makes its lane wait for the stamps of the stages before it on each request's walk. A stamp
set at completion is already passed on the device (the host read that completed the launch came
after it), so waiting for it costs nothing; a stamp set at launch (an encoder) is a real wait, for
the batches that need it only.

Memory of a tensor made on one lane and read on another is safe without ``record_stream``: a
request's cross-stage tensors (encoder rows, the thinker prompt's states for the talker) live as
long as the request, which ends only after the host has read results of the reading lane that
came after those reads.

On the CPU a lane is the host itself: the same calls, no streams, events that are already passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch


class Lane:
    def __init__(self, device):
        device = torch.device(device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if self.stream is not None:  # work queued before the lane existed (weights, KV pools) comes first
            self.stream.wait_stream(torch.cuda.current_stream(device))
        self.num_waits = 0  # distinct events waited for (the data edges crossed), for tests

    def launching(self):
        """Context in which the stage's kernels go to its stream."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def record(self):
        """An event after everything launched on this lane so far (on the CPU: a passed marker)."""
        if self.stream is None:
            return PASSED
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait_for(self, events: Iterable) -> None:
        """Later launches on this lane start after ``events`` (each counted once)."""
        seen = set()
        for event in events:
            if event is None or id(event) in seen:
                continue
            seen.add(id(event))
            self.num_waits += 1
            if self.stream is not None and event is not PASSED:
                self.stream.wait_event(event)


PASSED = object()  # the CPU's event: the host ran it already


def upstream_events(req, stage: str) -> list:
    """The stamps of the stages before ``stage`` on ``req``'s walk (what its inputs came from)."""
    before = req.walk[: req.walk.index(stage)] if stage in req.walk else ()
    return [req.produced.get(name) for name in before]
