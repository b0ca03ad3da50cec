"""The OpenAI-compatible HTTP server (FastAPI) in front of the engine process.

Routes: POST /v1/chat/completions, POST /v1/audio/speech, /v1/responses (``responses_routes.py``),
GET /v1/models, GET /v1/models/{id} (the base model and its LoRA adapters, each with ``parent``),
POST /v1/load_lora_adapter {lora_name, lora_path} (a path inside ``--lora-root``) and
/v1/unload_lora_adapter {lora_name} (its requests in flight finish with it),
GET /health (200 ready, or degraded: a data-parallel replica is dead; 503 starting / failed /
engine_dead / draining, with the reason; each replica's status; no process ids), GET /metrics
(Prometheus), the WebSocket GET /v1/realtime (``realtime/``), the talk page at /. With an API
key set, every route but /health and the page needs it (/v1/models and /metrics too).
Every error has OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` (``errors.py``):
400 invalid body (``param`` names the field), 401 bad key, 404 unknown route or model, 405 wrong
method, 408 headers or body too slow (``guard.py``), 413 body too large, 415 a body that is not
``application/json``, 429 engine or media queue full (Retry-After), 500 a request that
failed in the engine or an unexpected fault (with the request id, logged with its traceback),
503 engine starting or gone. Order of checks: route, auth, readiness, body size, content type, JSON + schema,
semantics, media decoding, engine. A client that hangs up (streaming or not) aborts its request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from omniwalk.config import ServerConfig
from omniwalk.media.limits import MediaLimits
from omniwalk.serve import openai_api as api
from omniwalk.serve import schemas
from omniwalk.serve.adapter_routes import adapter_entry, add_adapter_routes
from omniwalk.serve.audio_format import encode_audio, mime_type
from omniwalk.serve.audio_store import AudioStore
from omniwalk.serve.errors import APIError, validation_error
from omniwalk.serve.guard import ClientGone, Guard
from omniwalk.serve.media_pool import MediaPool
from omniwalk.serve.metrics import Metrics
from omniwalk.serve.page import add_page_routes
from omniwalk.serve.realtime.route import add_realtime_route
from omniwalk.serve.replicas import Replicas
from omniwalk.serve.responses_routes import add_responses_routes
from omniwalk.serve.routing import affinity_key
from omniwalk.serve.run import EngineRun
from omniwalk.serve.speech import speech_request
from omniwalk.serve.supervisor import Supervisor
from omniwalk.serve.voice_aliases import check_voice_aliases

error_log = logging.getLogger("omniwalk.error")


@dataclass
class Served:
    """What the routes share: the engine, the server's config and its per-process parts."""

    client: Replicas  # the engine processes (one per data-parallel replica)
    cfg: ServerConfig
    supervisor: Supervisor
    metrics: Metrics
    pool: MediaPool
    store: AudioStore

    def context(self) -> api.Context:
        return api.Context(self.cfg, self.pool, self.store, self.client.info, self.adapters)

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters served (every replica serves the same)."""
        return self.client.adapters

    def authorize(self, request: Request) -> None:
        given, key = request.headers.get("authorization", "").encode(), self.cfg.api_key
        if key and not hmac.compare_digest(given, f"Bearer {key}".encode()):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")

    async def body(self, request: Request, base: type[schemas.Strict], family_fields: bool = True):
        """Auth, readiness, the content type, then the body (size-capped and timed by the guard)
        parsed by ``base`` with the model family's own request fields (unless ``family_fields`` is False)."""
        self.authorize(request)
        if self.supervisor.state != "ready":
            raise APIError(503, f"the server is not ready ({self.supervisor.state})", code="engine_unavailable")
        _require_json(request)
        try:
            return (self.schema(base) if family_fields else base).model_validate_json(await request.body())
        except ValidationError as e:
            raise validation_error(e) from None

    def schema(self, base: type[schemas.Strict]) -> type[schemas.Strict]:
        """``base`` with the model family's own request fields (a speech body: its speech fields)."""
        info = self.client.info
        fields = info.speech_fields if base is schemas.SpeechRequest else info.request_fields
        return schemas.with_fields(base, {name: info.request_fields[name] for name in fields})


def _require_json(request: Request) -> None:
    """A JSON body must say so: a browser page of another site can send ``text/plain`` (or no type)
    without asking the server first (no CORS preflight), but not ``application/json``."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        message = f"the body must be sent as application/json, not {kind or 'without a content type'}"
        raise APIError(415, message, code="unsupported_media_type")


def create_app(client: Replicas, cfg: ServerConfig, limits: MediaLimits, supervisor: Supervisor):
    """The ASGI app. The engine client is started in the lifespan, in the background (``/health``
    says "starting" until the model is loaded)."""
    metrics = Metrics()
    pool = MediaPool(limits, cfg.media_workers, cfg.max_media_queue, metrics)
    store = AudioStore(cfg.audio_store_size, cfg.audio_expiry_s)
    served = Served(client, cfg, supervisor, metrics, pool, store)

    async def start() -> None:
        try:
            await client.start()
            check_voice_aliases(cfg.voice_aliases, client.info.voices)  # (a ConfigError stops the server)
        except Exception as e:  # noqa: BLE001 - reported by the supervisor, which stops the server
            supervisor.failed_to_start(e)
        else:
            supervisor.ready()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(start())
        yield
        starting.cancel()
        pool.close()
        client.close()

    app = FastAPI(lifespan=lifespan, title="omniwalk", openapi_url=None, docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    _info_routes(app, served)
    _generation_routes(app, served)
    add_adapter_routes(app, served)
    add_responses_routes(app, served)
    add_realtime_route(app, served)
    add_page_routes(app)
    return Guard(app, cfg, metrics)


def _info_routes(app: FastAPI, served: Served) -> None:
    @app.get("/health")
    async def health():
        status, body = served.supervisor.health()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models")
    async def models(request: Request):
        served.authorize(request)
        adapters = [adapter_entry(served, name) for name in served.adapters]
        return {"object": "list", "data": [_model_entry(served), *adapters]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        served.authorize(request)
        name = api.check_model(model_id, served.context())
        return _model_entry(served) if name == served.context().model_name else adapter_entry(served, name)

    @app.get("/metrics")
    async def prometheus(request: Request):
        served.authorize(request)  # (Prometheus sends the key with ``authorization: {credentials: ...}``)
        served.metrics.update_engine(served.client.stats)
        return Response(served.metrics.render(), media_type="text/plain; version=0.0.4")


def _generation_routes(app: FastAPI, served: Served) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await served.body(request, schemas.ChatRequest)
        engine_request, options = await api.chat_request(body, served.context(), request.receive)
        key = affinity_key(body.model_dump(include={"messages"}, exclude_none=True))
        run = EngineRun(served.client, engine_request, served.metrics, key)
        first = await run.first_event()  # engine-side validation errors still become 4xx here
        if options.stream:
            events = run.sse(first, options, served.store)
            return StreamingResponse(events, media_type="text/event-stream")
        output = await run.collect_unless_disconnected(first, request.receive)
        if output is None:
            return Response(status_code=499)  # nobody reads it: counted as the client's hang-up
        return api.completion(output, options, served.store, served.client.info.sample_rate)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        body = await served.body(request, schemas.SpeechRequest)
        engine_request, fmt = speech_request(body, served.context())
        engine_request.update(api.adapter_fields(body.model, served.context()))  # (the thinker runs the adapter)
        run = EngineRun(served.client, engine_request, served.metrics)
        output = await run.collect_unless_disconnected(await run.first_event(), request.receive)
        if output is None:
            return Response(status_code=499)
        audio = encode_audio(output["audio"], fmt, served.client.info.sample_rate)
        return Response(audio, media_type=mime_type(fmt))


def _model_entry(served: Served) -> dict:
    ctx = served.context()
    entry = {"id": ctx.model_name, "object": "model", "created": 0, "owned_by": "omniwalk"}
    if ctx.info is not None and ctx.info.weights:  # (an extension: quantisation and weight memory)
        entry["weights"] = ctx.info.weights
    if ctx.info is not None and "audio" in ctx.info.output_modalities:  # (an extension: what audio out offers)
        entry["voices"], entry["sample_rate"] = list(ctx.info.voices), ctx.info.sample_rate
    return entry


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):
        return APIError(400, "invalid request", code="invalid_value").response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        if e.status_code == 404:
            return APIError(404, f"no route {request.url.path}", code="not_found").response()
        if e.status_code == 405:
            error = APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
            return JSONResponse(error.body(), status_code=405, headers=e.headers)
        return APIError(e.status_code, str(e.detail), code=None).response()

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, e: ClientDisconnect):
        return ClientGone().response()  # (read past the guard: still the client's hang-up, not a fault)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        rid = request.scope.get("state", {}).get("request_id", "-")
        error_log.error("unexpected error in %s %s (request id %s)", request.method, request.url.path, rid, exc_info=e)
        return APIError(500, f"internal server error (request id {rid})", code="internal_error").response()
