"""The outermost ASGI layer: what every HTTP request passes, whatever the route.

- a request id (``x-request-id`` response header; in 500 bodies and the logs);
- the body limit before any work: a ``Content-Length`` over ``max_body_bytes`` is answered 413
  without reading the body (the server discards it as it arrives, so the connection stays
  usable), and a body without one is counted while it is read (``receive`` raises past the limit);
- every response counted by route and status (``omniwalk_http_responses_total``; "499" when the
  client hung up before the response ended), and logged on ``omniwalk.access`` (INFO);
- a last resort: an exception that escapes the app is logged with its traceback and, if nothing
  was sent yet, answered with a JSON 500. It is not re-raised, so the server keeps the
  keep-alive connection open for the client's next request.
"""

from __future__ import annotations

import logging
import time
import uuid

from omniwalk.serve.errors import APIError
from omniwalk.serve.metrics import Metrics

access_log = logging.getLogger("omniwalk.access")
error_log = logging.getLogger("omniwalk.error")
ROUTES = ("/v1/chat/completions", "/v1/audio/speech", "/v1/models", "/health", "/metrics")


class BodyTooLarge(APIError):
    def __init__(self, limit: int):
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")


class Guard:
    def __init__(self, app, max_body_bytes: int, metrics: Metrics):
        self.app, self.max_body_bytes, self.metrics = app, max_body_bytes, metrics

    async def __call__(self, scope, receive, send):
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
        total = 0

        async def receive_capped():
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        return receive_capped

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
