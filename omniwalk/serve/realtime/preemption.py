"""Preemptive answers: the answer to a turn starts in the engine before the turn is confirmed.

When the server VAD reports a tentative end of turn (``preemptive_silence_ms`` of quiet, shorter
than the ``silence_duration_ms`` that confirms it: ``vad.py``), the session builds the response's
engine request as it would at the confirmation, with the turn's audio as the last user item (the
VAD gives the same samples then), and starts it. Nothing is sent: its events wait in the engine
client's queue. Then one of:

    the turn is confirmed, and the request it would send equals the prepared one
        -> kept: the response runs on the prepared engine run; the events already generated go
           out at once, with ids allocated then (the client sees the events of the flow without
           preemption, earlier)
    speech resumes, the buffer is cleared or committed, turn detection changes, the session
    closes, or the confirmed turn's request differs (the conversation or settings changed, a
    response is already playing)
        -> discarded: the engine request is aborted (its pages are freed at the engine's next
           step) and nothing was in the conversation

Counted in ``omniwalk_realtime_preemptions_total{outcome="started|kept|discarded"}``.
"""

from __future__ import annotations

import asyncio

from omniwalk.serve.openai_api import ChatOptions
from omniwalk.serve.run import EngineRun
from omniwalk.serve.wire import Delta, Finished


class Prepared:
    """A response's engine run, started before its turn was confirmed; its first event is awaited
    in the background (that submits the request), the rest queue in the engine client."""

    def __init__(self, body: dict, request: dict, options: ChatOptions, run: EngineRun, counter=None, release=None):
        """``release``: called once it is kept or discarded (lets go of its turn's audio)."""
        self.body, self.request, self.options, self.run = body, request, options, run
        self.counter, self.release = counter, release
        self.first = asyncio.ensure_future(run.first_event())
        self._count("started")

    def keep(self) -> None:
        self._end("kept")

    async def first_event(self) -> Delta | Finished:
        return await self.first

    async def discard(self) -> None:
        """Abort the engine request; nothing of it was sent."""
        self.first.cancel()
        await asyncio.gather(self.first, return_exceptions=True)
        await self.run.close()
        self._end("discarded")

    def _end(self, outcome: str) -> None:
        self._count(outcome)
        if self.release is not None:
            self.release()

    def _count(self, outcome: str) -> None:
        if self.counter is not None:
            self.counter.labels(outcome).inc()
