"""The outermost ASGI layer: what every HTTP request passes, whatever the route.

- a request id (``x-request-id`` response header; in 500 bodies and the logs);
- the body limit before any work: a ``Content-Length`` over ``max_body_bytes`` is answered 413
  without reading the body (the server discards it as it arrives, so the connection stays
  usable), and a body without one is counted while it is read (``receive`` raises past the limit);
- every response counted by route and status (``omniwalk_http_responses_total``; "499" when the
  client hung up before the response ended), and logged on ``omniwalk.access`` (INFO);
- the body's deadline: it must arrive within ``body_timeout_s`` of the headers, else 408 and the
  connection is closed; a client that hangs up before its body is complete is answered (to no one)
  and counted 499, without a traceback;
- the Origin of a WebSocket handshake: a browser page of another origin than the server's own and
  not in ``allowed_origins`` is refused with 403 (clients that send no Origin, such as SDKs, pass);
- a last resort: an exception that escapes the app is logged with its traceback and, if nothing
  was sent yet, answered with a JSON 500. It is not re-raised, so the server keeps the
  keep-alive connection open for the client's next request.

``HeaderDeadline`` is the HTTP protocol below it: a request's headers must be complete within
``header_timeout_s`` of the connection's start (or of the previous response's end), else the
client gets a 408 and the connection is closed (slowloris connections free their slot).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from urllib.parse import urlsplit

import h11
from starlette.websockets import WebSocket
from uvicorn.protocols.http.h11_impl import H11Protocol

from omniwalk.config import ServerConfig
from omniwalk.serve.errors import APIError
from omniwalk.serve.metrics import Metrics

access_log = logging.getLogger("omniwalk.access")
error_log = logging.getLogger("omniwalk.error")
ROUTES = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/audio/speech",
    "/v1/models",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/health",
    "/metrics",
    "/v1/realtime",
)


class BodyTooLarge(APIError):
    def __init__(self, limit: int):
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")


class BodyTimeout(APIError):
    def __init__(self, limit: float):
        message = f"the request body did not arrive within {limit:g} s"
        super().__init__(408, message, code="request_timeout", headers={"Connection": "close"})


class ClientGone(APIError):
    """The client hung up before its body was complete: the answer reaches no one; counted 499."""

    def __init__(self):
        super().__init__(499, "the client closed the connection before its body arrived", code="client_closed")


class Guard:
    def __init__(self, app, cfg: ServerConfig, metrics: Metrics):
        self.app, self.max_body_bytes, self.metrics = app, cfg.max_body_bytes, metrics
        self.body_timeout_s = cfg.body_timeout_s
        self.origins = {o.strip().rstrip("/") for o in cfg.allowed_origins.split(",") if o.strip()}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not self._origin_allowed(scope):
            return await self._refuse_origin(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = f"req_{uuid.uuid4().hex[:24]}"
        scope.setdefault("state", {})["request_id"] = rid
        sent = {"status": None, "complete": False}
        start = time.monotonic()

        async def send_tagged(message):
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent["complete"] = True
            await send(message)

        try:
            if self._declared_length(scope) > self.max_body_bytes:
                await BodyTooLarge(self.max_body_bytes).response()(scope, receive, send_tagged)
            else:
                await self.app(scope, self._capped(receive), send_tagged)
        except Exception:  # noqa: BLE001 - the last resort; the app's handlers answer everything they can
            if sent["status"] is None:
                error_log.exception("unhandled error in %s %s (request id %s)", scope["method"], scope["path"], rid)
                await _internal_error(rid).response()(scope, receive, send_tagged)
        finally:
            status = str(sent["status"]) if sent["complete"] else "499"
            self.metrics.responses.labels(_route(scope), status).inc()
            access_log.info(
                '%s %s "%s %s" %s %.0fms',
                rid,
                (scope.get("client") or ("-",))[0],
                scope["method"],
                scope["path"],
                status,
                (time.monotonic() - start) * 1000,
            )

    def _capped(self, receive):
        """``receive`` with the body's size cap and deadline; once the body is complete, plain
        (a later ``http.disconnect`` is the hang-up that aborts a running request)."""
        total, done, deadline = 0, False, time.monotonic() + self.body_timeout_s

        async def receive_capped():
            nonlocal total, done
            if done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                raise BodyTimeout(self.body_timeout_s) from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            total += len(message.get("body", b""))
            if total > self.max_body_bytes:
                raise BodyTooLarge(self.max_body_bytes)
            done = not message.get("more_body", False)
            return message

        return receive_capped

    def _origin_allowed(self, scope) -> bool:
        headers = dict(scope.get("headers", ()))
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/")
        if not origin or origin in self.origins:
            return True
        parts = urlsplit(origin)
        own = {"ws": "http", "wss": "https"}.get(scope.get("scheme", "ws"), "http")
        return parts.scheme == own and parts.netloc == headers.get(b"host", b"").decode("latin-1")

    async def _refuse_origin(self, scope, receive, send) -> None:
        error = APIError(403, "this Origin may not open a WebSocket on this server", code="origin_not_allowed")
        ws = WebSocket(scope, receive, send)
        try:
            await ws.send_denial_response(error.response())
        except RuntimeError:  # a server without the denial extension: a plain refusal (403)
            await ws.close(1008)
        self.metrics.responses.labels(scope["path"] if scope["path"] in ROUTES else "other", "403").inc()
        access_log.info('- %s "WEBSOCKET %s" 403 (origin refused)', (scope.get("client") or ("-",))[0], scope["path"])

    @staticmethod
    def _declared_length(scope) -> int:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                return int(value) if value.isdigit() else 0
        return 0


def _internal_error(rid: str) -> APIError:
    return APIError(500, f"internal server error (request id {rid})", code="internal_error")


def _route(scope) -> str:
    """The matched route's path template; unknown paths share one label (no label per scanner probe)."""
    route = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return route.path
    path = scope.get("path", "")
    return path if path in ROUTES else "other"


def header_deadline(timeout_s: float, metrics: Metrics) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's headers (``http=`` of its config)."""
    return type("HeaderDeadline", (HeaderDeadline,), {"timeout_s": timeout_s, "metrics": metrics})


class HeaderDeadline(H11Protocol):
    """Armed when the connection opens and whenever it waits for a request's headers (the state
    h11 calls IDLE on the client's side); cancelled once they are complete."""

    timeout_s: float = 10.0
    metrics: Metrics | None = None
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._rearm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._rearm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._rearm()

    def connection_lost(self, exc) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _rearm(self) -> None:
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._deadline is None:
            self._deadline = self.loop.call_later(self.timeout_s, self._expired)
        elif not waiting:
            self._cancel()

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is not h11.IDLE:  # (a response still being written: keep-alive's timer ends it)
            return
        message = f"the request headers did not arrive within {self.timeout_s:g} s"
        body = json.dumps(APIError(408, message, code="request_timeout").body()).encode()
        head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        self.transport.write(head.encode() + b"connection: close\r\n\r\n" + body)
        self.transport.close()
        if self.metrics is not None:
            self.metrics.responses.labels("other", "408").inc()
        access_log.info('- %s "-" 408 (headers timed out)', (self.client or ("-",))[0])
