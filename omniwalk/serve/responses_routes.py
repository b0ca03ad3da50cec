"""The /v1/responses routes: create (streamed or not), retrieve, delete and cancel.

Create: the body is parsed (``responses_schemas``), becomes a chat body (``responses_api``) and goes
the chat completions' way (``openai_api.chat_request``, ``EngineRun``); any 400 on the way names
the Responses field. Stored responses (``store`` defaults to true) live in a ``ResponseStore``
bounded by ``--response-store-size``, ``--response-expiry-s`` and ``--response-store-bytes``.
Every response here runs in the foreground, so none can be cancelled: cancel answers 400 for a
stored response (as OpenAI does for one not created with ``background``) and 404 for an unknown one.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from omniwalk.serve import openai_api as api
from omniwalk.serve import response_body as rb
from omniwalk.serve import responses_api as ra
from omniwalk.serve import schemas
from omniwalk.serve.errors import APIError
from omniwalk.serve.response_store import ResponseStore
from omniwalk.serve.responses_schemas import ResponsesRequest
from omniwalk.serve.responses_stream import ResponseEvents, sse
from omniwalk.serve.routing import affinity_key
from omniwalk.serve.run import EngineRun


def add_responses_routes(app: FastAPI, served) -> None:
    """``served``: the app's ``Served`` (its engine, config, metrics and body parsing)."""
    cfg = served.cfg
    store = ResponseStore(cfg.response_store_size, cfg.response_expiry_s, cfg.response_store_bytes)

    def stored(request: Request, response_id: str):
        served.authorize(request)
        entry = store.get(response_id)
        if entry is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", code="not_found")
        return entry

    @app.post("/v1/responses")
    async def create(request: Request):
        try:
            body = await served.body(request, ResponsesRequest)
        except APIError as e:
            raise ra.renamed(e, []) from None
        turn = ra.turn_of(body, store, served.client.info.request_fields)
        try:
            chat = ra.chat_of(turn, served.schema(schemas.ChatRequest))
            engine_request, options = await api.chat_request(chat, served.context(), request.receive)
            key = affinity_key(chat.model_dump(include={"messages"}, exclude_none=True))
            run = EngineRun(served.client, engine_request, served.metrics, key)
            first = await run.first_event()  # engine-side validation errors still become 4xx here
        except APIError as e:
            raise ra.renamed(e, turn.sources) from None
        turn.echo["model"] = options.model
        if options.stream:
            events = ResponseEvents(turn, options.parses_tools)
            return StreamingResponse(sse(run, first, events, store), media_type="text/event-stream")
        output = await run.collect_unless_disconnected(first, request.receive)
        if output is None:
            return Response(status_code=499)  # nobody reads it: counted as the client's hang-up
        response = turn.finished(output, rb.output_items(output, options.parses_tools))
        turn.keep(store, response)
        return response

    @app.get("/v1/responses/{response_id}")
    async def retrieve(request: Request, response_id: str):
        return stored(request, response_id).body

    @app.delete("/v1/responses/{response_id}")
    async def delete(request: Request, response_id: str):
        stored(request, response_id)
        store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(request: Request, response_id: str):
        stored(request, response_id)
        message = (
            "Only responses created with background=True can be cancelled (this server runs none in the background)"
        )
        raise APIError(400, message, code="invalid_value")
