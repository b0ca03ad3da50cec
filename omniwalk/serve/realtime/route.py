"""``GET /v1/realtime``: the WebSocket that carries a Realtime session.

The handshake is checked before it is accepted, in the HTTP API's order, and refused with an HTTP response
carrying OpenAI's error body: 401 a missing or wrong API key (``Authorization: Bearer``, or, for browsers,
which cannot set headers, the subprotocol ``openai-insecure-api-key.<key>``), 503 the engine is not ready, 429
``realtime_max_sessions`` open already. Any ``?model=`` is accepted and served by the one model (realtime
clients name OpenAI's models in the URL: ``gpt-realtime``, ``gpt-4o-realtime-preview-...``); the session's
``model`` shows the served model's name, or the LoRA adapter it names (its answers then run that adapter). An
accepted session lasts at most ``realtime_max_session_s`` (an ``error`` event with code ``session_expired``,
then the close), and ends when the client sends no event for ``realtime_idle_timeout_s`` while no answer is
being generated (an ``error`` event with code ``idle_timeout``, then the close). The sessions share one
``AudioBudget`` for their conversations' audio (``bounds.py``), and one ``Preemptions``: the count of
realtime responses being generated, which decides whether a tentative end of turn prepares its answer.
A client that goes away ends its session: a response in progress is aborted in the engine, and
the media decoding of the event being handled (a response's prompt) stops.
Sessions are counted in ``omniwalk_realtime_sessions`` and, when they end, in
``omniwalk_http_responses_total{route="/v1/realtime",status="101"}`` and the access log; their
preemptive answers in ``omniwalk_realtime_preemptions_total{outcome}`` (``preemption.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid

from fastapi import FastAPI, WebSocket
from prometheus_client import Counter

from omniwalk.serve.errors import APIError
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.bounds import AudioBudget
from omniwalk.serve.realtime.preemption import Preemptions
from omniwalk.serve.realtime.response import is_disconnect
from omniwalk.serve.realtime.session import Emitter, Session
from omniwalk.serve.routing import affinity_key
from omniwalk.serve.run import EngineRun

ROUTE = "/v1/realtime"
KEY_PROTOCOL = "openai-insecure-api-key."
access_log = logging.getLogger("omniwalk.access")
error_log = logging.getLogger("omniwalk.error")


class Sessions:
    """The open sessions' count (the limit) and their accounting."""

    def __init__(self, served):
        self.served, self.num_open = served, 0
        self.budget = AudioBudget(served.cfg.realtime_max_total_audio_bytes)
        counter = Counter(
            "omniwalk_realtime_preemptions",
            "Answers started on a tentative end of turn, by outcome (started, kept, discarded), and tentative ends"
            " that started none as realtime_preemption_max_responses responses were being generated (skipped)",
            ["outcome"],
            registry=served.metrics.registry,
        )
        self.preemptions = Preemptions(counter, served.cfg.realtime_preemption_max_responses)

    def check(self, ws: WebSocket) -> None:
        """Raise the APIError that refuses this handshake, if any."""
        served, cfg = self.served, self.served.cfg
        offered = _subprotocols(ws)
        key = next((s[len(KEY_PROTOCOL) :] for s in offered if s.startswith(KEY_PROTOCOL)), None)
        given = f"Bearer {key}".encode() if key is not None else ws.headers.get("authorization", "").encode()
        if cfg.api_key and not hmac.compare_digest(given, f"Bearer {cfg.api_key}".encode()):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")
        if served.supervisor.state != "ready":
            raise APIError(503, f"the server is not ready ({served.supervisor.state})", code="engine_unavailable")
        if self.num_open >= cfg.realtime_max_sessions:
            raise APIError(
                429,
                f"{cfg.realtime_max_sessions} realtime sessions are open; retry later",
                code="session_limit_reached",
                headers={"Retry-After": "1"},
            )

    def count(self, status: int, rid: str, ws: WebSocket, start: float) -> None:
        self.served.metrics.responses.labels(ROUTE, str(status)).inc()
        client = ws.client.host if ws.client else "-"
        access_log.info('%s %s "WEBSOCKET %s" %s %.0fms', rid, client, ROUTE, status, (time.monotonic() - start) * 1000)


def add_realtime_route(app: FastAPI, served) -> None:
    sessions = Sessions(served)

    @app.websocket(ROUTE)
    async def realtime(ws: WebSocket):
        rid, start = f"req_{uuid.uuid4().hex[:24]}", time.monotonic()
        try:
            sessions.check(ws)
        except APIError as e:
            await _refuse(ws, e)
            sessions.count(e.status, rid, ws, start)
            return
        sessions.num_open += 1
        served.metrics.realtime_sessions.inc()
        try:
            await _serve(ws, served, sessions)
        finally:
            sessions.num_open -= 1
            served.metrics.realtime_sessions.dec()
            sessions.count(101, rid, ws, start)


async def _serve(ws: WebSocket, served, sessions: Sessions) -> None:
    offered = _subprotocols(ws)
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    is_beta = "realtime=v1" in ws.headers.get("openai-beta", "") or "openai-beta.realtime-v1" in offered
    cfg = served.cfg
    expires_at = int(time.time() + cfg.realtime_max_session_s)
    emit = Emitter(ws.send_text, is_beta)

    def run_engine(request: dict) -> EngineRun:  # (a session's answers go to the replica holding its pages)
        return EngineRun(served.client, request, served.metrics, affinity_key({}, session.settings.id))

    context = served.context()
    adapter = ws.query_params.get("model")  # (any other name is served by the base model)
    adapter = adapter if adapter in context.adapters else None
    session = Session(emit, cfg, context, run_engine, expires_at, sessions.budget, sessions.preemptions, adapter)
    try:
        await session.start()
        async with asyncio.timeout(cfg.realtime_max_session_s):
            is_idle = await _receive_until_idle(ws, session, cfg.realtime_idle_timeout_s)
        if is_idle:
            idle = f"no client event for {cfg.realtime_idle_timeout_s:g} s"
            await _end(ws, session, APIError(400, idle, code="idle_timeout"))
    except TimeoutError:
        limit = f"the session reached its limit of {cfg.realtime_max_session_s:g} s"
        await _end(ws, session, APIError(400, limit, code="session_expired"))
    except Exception as e:
        if not is_disconnect(e):
            raise
        # the client went away (sending to it failed)
    finally:
        await session.close()


async def _receive_until_idle(ws: WebSocket, session: Session, idle_s: float) -> bool:
    """Handle client events until the client goes away (False) or is idle (True): no event for
    ``idle_s`` while no answer is generated (a client listening to a long answer is not idle).

    The next message is read while an event is handled, so a client that goes away during a
    handler (a ``response.create`` whose prompt's audio the media pool is decoding) stops that
    handler at once: its media items are dropped or stop at their next chunk, counted in
    ``omniwalk_media_cancelled_total`` as an HTTP request's are when its client hangs up. At most
    one message is read ahead (a client's flood waits in the socket)."""
    reading = asyncio.ensure_future(ws.receive())
    handling: asyncio.Future | None = None
    try:
        while True:
            if not (await asyncio.wait({reading}, timeout=idle_s))[0]:
                if session.is_responding:
                    continue
                return True
            message = reading.result()
            if message["type"] == "websocket.disconnect":
                return False
            reading = asyncio.ensure_future(ws.receive())
            handling = asyncio.ensure_future(session.handle(_payload(message)))
            await asyncio.wait({reading, handling}, return_when=asyncio.FIRST_COMPLETED)
            if not handling.done() and reading.result()["type"] == "websocket.disconnect":
                return False  # (the handler is cancelled below, its media work with it)
            await handling
    finally:
        for task in (reading, handling):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (reading, handling) if t is not None), return_exceptions=True)


def _payload(message: dict) -> str | bytes:
    return message["text"] if message.get("text") is not None else message.get("bytes")


async def _end(ws: WebSocket, session: Session, reason: APIError) -> None:
    """Close the session from our side: its work stops, the client gets the reason as an ``error`` event."""
    await session.close()
    await session.emit.send(p.error_event(reason))
    await ws.close(1000)


async def _refuse(ws: WebSocket, e: APIError) -> None:
    from fastapi.responses import JSONResponse

    try:
        await ws.send_denial_response(JSONResponse(e.body(), status_code=e.status, headers=e.headers))
    except RuntimeError:  # a server without the denial extension: a plain refusal (403)
        await ws.close(1008)


def _subprotocols(ws: WebSocket) -> list[str]:
    return [s.strip() for s in ws.scope.get("subprotocols", ())]
