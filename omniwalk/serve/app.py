"""The OpenAI-compatible HTTP server (FastAPI) in front of the engine process.

Routes: POST /v1/chat/completions, POST /v1/audio/speech, GET /v1/models, GET /health (200
ready / 503 starting), GET /metrics (Prometheus). Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``: 400 bad request, 401 bad key, 413 body too
large, 429 engine full (with Retry-After), 500 a request that failed in the engine. A client that
disconnects from a stream aborts its request.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from omniwalk.config import ServerConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.serve import openai_api as api
from omniwalk.serve.audio_format import encode_audio, mime_type
from omniwalk.serve.engine_client import EngineClient, EngineRequestError
from omniwalk.serve.metrics import Metrics

SPEECH_SYSTEM_PROMPT = "Read the user's text aloud, exactly as written."


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers


def error_response(status: int, message: str, kind: str, headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def engine_error(e: EngineRequestError) -> HTTPError:
    if e.error_type == "QueueFullError":
        return HTTPError(429, str(e), "rate_limit_error", {"Retry-After": "1"})
    if e.bad_request:
        return HTTPError(400, str(e))
    return HTTPError(500, f"the request failed in the engine: {e}", "server_error")


def create_app(client: EngineClient, cfg: ServerConfig, decode, on_ready=None) -> FastAPI:
    """``decode(ids) -> str`` renders logprob tokens; ``client`` is started in the lifespan, in the
    background (``/health`` says "starting" until the model is loaded), then ``on_ready()`` runs."""
    metrics = Metrics()

    async def start() -> None:
        await client.start()
        if on_ready is not None:
            on_ready()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(start())
        app.state.starting = starting
        yield
        starting.cancel()
        client.close()

    app = FastAPI(lifespan=lifespan, title="omniwalk")

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, e: HTTPError):
        return error_response(e.status, str(e), e.kind, e.headers)

    async def body_of(request: Request) -> dict:
        return await _read_body(request, cfg, _is_ready(app))

    @app.get("/health")
    async def health():
        ready = _is_ready(app) and client.is_alive
        return JSONResponse({"status": "ready" if ready else "starting"}, status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models():
        entry = {"id": cfg.served_model_name, "object": "model", "created": 0, "owned_by": "omniwalk"}
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def prometheus():
        metrics.update_engine(client.stats)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            engine_request, options = api.chat_request(await body_of(request), cfg)
        except InvalidRequestError as e:
            raise HTTPError(400, str(e)) from None
        run = _Run(client, engine_request, options, metrics)
        first = await run.first_event()  # engine-side validation errors still become 4xx here
        if options.stream:
            return StreamingResponse(run.sse(first, decode), media_type="text/event-stream")
        output = await run.collect(first)
        return api.completion(output, options, decode)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        try:
            engine_request, options = api.chat_request(_speech_as_chat(await body_of(request), cfg), cfg)
        except InvalidRequestError as e:
            raise HTTPError(400, str(e)) from None
        run = _Run(client, engine_request, options, metrics)
        output = await run.collect(await run.first_event())
        return Response(encode_audio(output["audio"], options.audio_format), media_type=mime_type(options.audio_format))

    return app


async def _read_body(request: Request, cfg: ServerConfig, ready: bool) -> dict:
    """Auth, readiness, size limit and JSON parsing, in that order."""
    if cfg.api_key and request.headers.get("authorization") != f"Bearer {cfg.api_key}":
        raise HTTPError(401, "invalid or missing API key", "authentication_error")
    if not ready:
        raise HTTPError(503, "the engine is still starting", "server_error")
    raw = await request.body()
    if len(raw) > cfg.max_body_bytes:
        raise HTTPError(413, f"request body of {len(raw)} bytes exceeds the limit of {cfg.max_body_bytes}")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"invalid JSON body: {e}") from None


def _speech_as_chat(body: dict, cfg: ServerConfig) -> dict:
    """/v1/audio/speech {input, voice, response_format} -> a chat body that speaks ``input``."""
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError("'input' must be a non-empty string")
    return {
        "model": body.get("model", cfg.served_model_name),
        "messages": [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": text}],
        "modalities": ["text", "audio"],
        "audio": {"voice": body.get("voice"), "format": body.get("response_format", "mp3")},
        **{k: v for k, v in body.items() if k in api.PASSTHROUGH},
    }


def _is_ready(app: FastAPI) -> bool:
    task = getattr(app.state, "starting", None)
    return task is not None and task.done() and not task.cancelled() and task.exception() is None


class _Run:
    """One request's trip through the engine, with its latency metrics."""

    def __init__(self, client: EngineClient, request: dict, options: api.ChatOptions, metrics: Metrics):
        self.events = client.generate(request)
        self.options, self.metrics = options, metrics
        self.start = time.monotonic()
        self.first_text = self.first_audio = self.last_text = None
        self.open = False

    async def first_event(self) -> dict:
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

    async def _next(self) -> dict:
        try:
            event = await self.events.__anext__()
        except EngineRequestError as e:
            self.metrics.requests.labels("error" if not e.bad_request else "rejected").inc()
            await self.close()
            raise engine_error(e) from None
        now = time.monotonic()
        if event["type"] == "text":
            if self.first_text is None:
                self.first_text = now
                self.metrics.ttft.observe(now - self.start)
            elif self.last_text is not None:
                self.metrics.itl.observe(now - self.last_text)
            self.last_text = now
        elif event["type"] == "audio" and self.first_audio is None:
            self.first_audio = now
            self.metrics.ttfa.observe(now - self.start)
        elif event["type"] == "finished":
            self._finish(event["output"], now)
        return event

    def _finish(self, output: dict, now: float) -> None:
        self.open = False
        self.metrics.in_flight.dec()
        self.metrics.requests.labels(output["finish_reason"]).inc()
        self.metrics.e2e.observe(now - self.start)
        if output.get("audio") is not None and len(output["audio"]):
            self.metrics.rtf.observe((now - self.start) / (len(output["audio"]) / 24000))

    async def collect(self, event: dict) -> dict:
        while event["type"] != "finished":
            event = await self._next()
        return event["output"]

    async def sse(self, event: dict, decode):
        """Server-sent events: role, text and audio deltas, the finish chunk, usage, [DONE]."""
        options, audio_id, transcript = self.options, f"audio-{uuid.uuid4().hex}", ""
        yield _sse(api.chunk(options, {"role": "assistant", "content": ""}))
        try:
            while True:
                if event["type"] == "text":
                    transcript += event["data"]
                    yield _sse(api.chunk(options, {"content": event["data"]}))
                elif event["type"] == "audio":
                    yield _sse(api.chunk(options, api.audio_delta(audio_id, event["data"], transcript)))
                    transcript = ""
                elif event["type"] == "finished":
                    output = event["output"]
                    if transcript and options.audio_format is not None:  # text after the last audio chunk
                        yield _sse(api.chunk(options, api.audio_delta(audio_id, [], transcript)))
                    logprobs = api.logprobs_block(output, decode)
                    yield _sse(api.chunk(options, {}, output["finish_reason"], logprobs))
                    if options.include_usage:
                        yield _sse({**api.chunk(options, {}), "choices": [], "usage": api.usage(output)})
                    break
                event = await self._next()
        except HTTPError as e:
            yield _sse({"error": {"message": str(e), "type": e.kind, "param": None, "code": e.status}})
        finally:
            await self.close()  # a disconnect cancels this generator here: the engine aborts the request
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
