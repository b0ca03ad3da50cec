"""One request's trip through the engine: its events, latency metrics, and the two ways it is
answered (collected into one body, or streamed as server-sent events).

Engine outcomes become ``APIError``s: a request the engine refused as invalid is a 400, a full
engine a 429, a request that failed inside the engine a 500, an engine that is gone (or a
shutdown whose grace period ran out) a 503.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from omniwalk.serve import openai_api as api
from omniwalk.serve import tool_responses
from omniwalk.serve.audio_store import AudioStore
from omniwalk.serve.engine_client import EngineRequestError, EngineUnavailableError
from omniwalk.serve.errors import APIError
from omniwalk.serve.metrics import Metrics
from omniwalk.serve.replicas import Replicas
from omniwalk.serve.wire import Delta, Finished


def engine_error(e: Exception, request_id: str) -> APIError:
    if isinstance(e, EngineUnavailableError):
        return APIError(503, f"the engine is unavailable: {e}", code="engine_unavailable")
    if e.error_type == "QueueFullError":
        return APIError(429, str(e), code="engine_full", headers={"Retry-After": "1"})
    if e.bad_request:
        return APIError(400, str(e), param=e.param, code="invalid_value")
    return APIError(500, f"the request failed in the engine: {e} (request id {request_id})", code="engine_error")


class EngineRun:
    def __init__(self, client: Replicas, request: dict, metrics: Metrics, key: str | None = None):
        """``key``: the request's affinity key (``routing.affinity_key``: the replica holding its
        conversation's prefix pages is preferred); None routes it by load alone."""
        self.sample_rate = client.info.sample_rate
        self.events = client.generate(request, key)
        self.id, self.metrics = request["request_id"], metrics
        self.start = time.monotonic()
        self.first_text = self.first_audio = self.last_text = None
        self.open = False

    async def first_event(self) -> Delta | Finished:
        self.open = True
        self.metrics.in_flight.inc()
        try:
            return await self._next()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """End the run: leave the in-flight gauge and, if it is still going, abort it."""
        if self.open:
            self.open = False
            self.metrics.in_flight.dec()
        await self.events.aclose()

    async def next_event(self) -> Delta | Finished:
        """The event after ``first_event`` (and so on, up to Finished); engine failures as APIError."""
        return await self._next()

    async def _next(self) -> Delta | Finished:
        try:
            event = await self.events.__anext__()
        except (EngineRequestError, EngineUnavailableError) as e:
            status = "rejected" if getattr(e, "bad_request", False) else "error"
            self.metrics.requests.labels(status).inc()
            await self.close()
            raise engine_error(e, self.id) from None
        now = time.monotonic()
        if isinstance(event, Delta) and event.timing:
            self._observe_phases(event.timing, now)
        if isinstance(event, Finished):
            self._finish(event, now)
        elif event.kind == "text":
            if self.first_text is None:
                self.first_text = now
                self.metrics.ttft.observe(now - self.start)
            elif self.last_text is not None:
                self.metrics.itl.observe(now - self.last_text)
            self.last_text = now
        elif self.first_audio is None:
            self.first_audio = now
            self.metrics.ttfa.observe(now - self.start)
        return event

    def _observe_phases(self, timing: dict, now: float) -> None:
        """Where the time to the first output went, by phase (``omniwalk_first_output_phase_seconds``)."""
        for phase in ("inbox", "add", "engine"):
            self.metrics.phases.labels(phase).observe(max(0.0, timing[phase]))
        self.metrics.phases.labels("outbox").observe(max(0.0, now - timing["flushed_at"]))

    def _finish(self, event: Finished, now: float) -> None:
        output = event.output
        for stage, seconds in (event.stage_starts or {}).items():
            self.metrics.stage_start.labels(stage).observe(max(0.0, seconds))
        self.open = False
        self.metrics.in_flight.dec()
        self.metrics.requests.labels(output["finish_reason"]).inc()
        self.metrics.e2e.observe(now - self.start)
        if output.get("audio") is not None and len(output["audio"]):
            self.metrics.rtf.observe((now - self.start) / (len(output["audio"]) / self.sample_rate))

    async def collect(self, event: Delta | Finished) -> dict:
        while not isinstance(event, Finished):
            event = await self._next()
        return event.output

    async def collect_unless_disconnected(self, event: Delta | Finished, receive) -> dict | None:
        """``collect``, but a client that hangs up first aborts the request (-> None)."""
        collecting = asyncio.ensure_future(self.collect(event))
        hangup = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({collecting, hangup}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hangup.cancel()
            if not collecting.done():
                collecting.cancel()
                await asyncio.gather(collecting, return_exceptions=True)
                await self.close()  # (the generator's exit sent the abort)
        return collecting.result() if not collecting.cancelled() else None

    async def sse(self, event: Delta | Finished, options: api.ChatOptions, store: AudioStore):
        """Server-sent events: role, text (or transcript) and audio deltas, the finish chunk,
        usage, [DONE]. A client that hangs up cancels this generator: the engine aborts."""
        speaks, audio_id = options.audio_format is not None, f"audio_{uuid.uuid4().hex}"

        def content_delta(text: str) -> dict:
            return {"audio": {"id": audio_id, "transcript": text}} if speaks else {"content": text}

        tools = tool_responses.ToolDeltas(content_delta) if options.parses_tools else None
        yield _sse(api.chunk(options, {"role": "assistant", "content": None if speaks else ""}))
        try:
            while True:
                if isinstance(event, Delta) and event.kind == "text":
                    for delta in tools.feed(event.data) if tools else [content_delta(event.data)]:
                        yield _sse(api.chunk(options, delta))
                elif isinstance(event, Delta):
                    yield _sse(api.chunk(options, api.audio_data_delta(audio_id, event.data)))
                else:
                    for delta in tools.finish() if tools else []:
                        yield _sse(api.chunk(options, delta))
                    for chunk in self._last_chunks(event.output, options, store, audio_id, tools):
                        yield _sse(chunk)
                    break
                event = await self._next()
        except APIError as e:
            yield _sse(e.body())
        finally:
            await self.close()
        yield "data: [DONE]\n\n"

    @staticmethod
    def _last_chunks(output: dict, options: api.ChatOptions, store: AudioStore, audio_id: str, tools) -> list[dict]:
        """The finish chunk (with the audio's end: its expiry, its transcript kept for later turns)
        and the usage chunk when asked for."""
        delta, transcript = {}, output["text"]
        if tools is not None:
            transcript = tool_responses.read_message(output["text"])[0] or ""
        if options.audio_format is not None:
            delta = {"audio": {"id": audio_id, "expires_at": store.put(audio_id, transcript)}}
        reason = tool_responses.finish_reason(output["finish_reason"], bool(tools and tools.has_calls))
        chunks = [api.chunk(options, delta, reason, api.logprobs_block(output))]
        if options.include_usage:
            chunks.append({**api.chunk(options, {}), "choices": [], "usage": api.usage(output)})
        return chunks


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
