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

Under load a discarded answer is engine work taken from the answers being generated (one per
pause inside a turn), so a tentative end of turn prepares nothing while the process's sessions
generate ``realtime_preemption_max_responses`` responses or more (``Preemptions``): the turn then
goes on exactly as without preemption, its answer started when it is confirmed.

Counted in ``omniwalk_realtime_preemptions_total{outcome="started|kept|discarded|skipped"}``.
"""

from __future__ import annotations

import asyncio

from omniwalk.serve.openai_api import ChatOptions
from omniwalk.serve.run import EngineRun
from omniwalk.serve.wire import Delta, Finished


class Preemptions:
    """The server process's preemptive answers: their count by outcome, and the load they start at.

    ``num_responses`` counts the realtime responses being generated in all sessions: a prepared
    answer from its start until it is kept or discarded, a response from its start to its end (a
    kept answer is counted once: it becomes its response in one step of the event loop)."""

    def __init__(self, counter, max_responses: int):
        """``counter``: by outcome; ``max_responses``: ``ServerConfig.realtime_preemption_max_responses``."""
        self.counter, self.max_responses = counter, max_responses
        self.num_responses = 0

    @property
    def has_room(self) -> bool:
        """Whether a tentative end of turn may start its answer now."""
        return not self.max_responses or self.num_responses < self.max_responses

    def count(self, outcome: str) -> None:
        self.counter.labels(outcome).inc()

    def track(self, task: asyncio.Task) -> None:
        """A response's task: counted until it is done."""
        self.num_responses += 1
        task.add_done_callback(self._response_done)

    def _response_done(self, _task: asyncio.Task) -> None:
        self.num_responses -= 1


class Prepared:
    """A response's engine run, started before its turn was confirmed; its first event is awaited
    in the background (that submits the request), the rest queue in the engine client."""

    def __init__(
        self,
        body: dict,
        request: dict,
        options: ChatOptions,
        run: EngineRun,
        preemptions: Preemptions | None = None,
        release=None,
    ):
        """``release``: called once it is kept or discarded (lets go of its turn's audio)."""
        self.body, self.request, self.options, self.run = body, request, options, run
        self.preemptions, self.release = preemptions, release
        self.first = asyncio.ensure_future(run.first_event())
        if preemptions is not None:
            preemptions.num_responses += 1
            preemptions.count("started")

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
        if self.preemptions is not None:
            self.preemptions.num_responses -= 1
            self.preemptions.count(outcome)
        if self.release is not None:
            self.release()
