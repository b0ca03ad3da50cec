"""One response: the conversation as a chat-completions request, its engine run streamed as events.

The prompt is built exactly as ``POST /v1/chat/completions`` builds a chat with audio input
(``openai_api.chat_request``: the same checks, limits, media pool and engine request): the
session's instructions as the system turn, then every item (user audio as ``input_audio``
parts, earlier answers as their text). Events, in order:

    response.created
    response.output_item.added, conversation.item.added (beta: .created), response.content_part.added
    (response.output_audio_transcript.delta | response.output_audio.delta)*   or  response.output_text.delta*
    response.output_audio.done, response.output_audio_transcript.done         or  response.output_text.done
    response.content_part.done, response.output_item.done, conversation.item.done (GA only)
    response.done  {status: completed | incomplete (max tokens) | cancelled | failed, usage}

``cancel`` (``response.cancel``, or speech starting while it plays) aborts the engine request at
once (its pages are freed at the engine's next step) and ends with ``response.done`` cancelled;
the item keeps what was streamed so far, marked incomplete.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import numpy as np
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from omniwalk.serve import openai_api as api
from omniwalk.serve import schemas
from omniwalk.serve.audio_format import pcm16_bytes
from omniwalk.serve.errors import APIError, validation_error
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.conversation import Item, Part
from omniwalk.serve.run import EngineRun
from omniwalk.serve.wire import Delta, Finished

SAMPLES_PER_MS = 24  # output PCM16 at 24 kHz
error_log = logging.getLogger("omniwalk.error")


def is_disconnect(e: BaseException) -> bool:
    """Sending to a client that went away (what ends a session, not a fault)."""
    return isinstance(e, WebSocketDisconnect | OSError | RuntimeError)


async def engine_request(body: dict, ctx: api.Context) -> dict:
    """A chat-completions body (a dict) -> the engine request chat completions would send (the body
    checked by the chat schema with the model family's own fields, as the HTTP route checks it)."""
    fields = ctx.info.request_fields if ctx.info is not None else {}
    try:
        chat = schemas.with_fields(schemas.ChatRequest, dict(fields)).model_validate_json(json.dumps(body))
    except ValidationError as e:
        raise validation_error(e) from None
    request, _ = await api.chat_request(chat, ctx)
    return request


class Response:
    def __init__(
        self,
        emit,
        run_engine,
        request: dict,
        item: Item,
        previous_item_id: str | None,
        speaks: bool,
        metadata: dict | None = None,
    ):
        self.id = p.new_id("resp")
        self.emit, self.run_engine, self.request = emit, run_engine, request
        self.item, self.previous_item_id, self.speaks, self.metadata = item, previous_item_id, speaks, metadata
        self.part = Part("audio" if speaks else "text")
        self.num_samples = 0  # audio streamed
        self.cancel_reason: str | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def cancel(self, reason: str | None) -> None:
        """Stop it and wait for its last event (``reason`` None: the session is closing, send nothing)."""
        if self.task is None:
            return
        if not self.task.done():
            self.cancel_reason = reason
            self.task.cancel()
        (outcome,) = await asyncio.gather(self.task, return_exceptions=True)
        if isinstance(outcome, Exception) and not is_disconnect(outcome):
            error_log.error("a realtime response failed (%s)", self.id, exc_info=outcome)

    async def run(self) -> None:
        await self._open()
        status, details, usage = "completed", None, None
        try:
            output = await self._stream()
            usage = _usage(output)
            if output["finish_reason"] == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            if self.cancel_reason is None:
                raise  # the session is closing: nobody to tell
            status, details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}
        except APIError as e:
            status, details = "failed", {"type": "failed", "error": {"type": e.kind, "code": e.code, "message": str(e)}}
        self.item.status = "completed" if status == "completed" else "incomplete"
        await self._close(status, details, usage)

    async def _stream(self) -> dict:
        run: EngineRun = self.run_engine(self.request)
        try:
            event = await run.first_event()
            while not isinstance(event, Finished):
                await self._delta(event)
                event = await run.next_event()
            return event.output
        finally:
            await run.close()  # (a run still going is aborted in the engine)

    async def _delta(self, event: Delta) -> None:
        ids = {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}
        if event.kind == "text":
            self.part.text += event.data
            kind = "response.output_audio_transcript.delta" if self.speaks else "response.output_text.delta"
            await self.emit(kind, **ids, delta=event.data)
        elif event.kind == "audio":
            samples = np.asarray(event.data, np.float32)
            self.num_samples += len(samples)
            self.part.audio_ms = self.num_samples // SAMPLES_PER_MS
            await self.emit("response.output_audio.delta", **ids, delta=base64.b64encode(pcm16_bytes(samples)).decode())

    async def _open(self) -> None:
        self.item.parts, self.item.status = [self.part], "in_progress"
        await self.emit("response.created", response=self._json("in_progress", None, None, []))
        empty = {**self.item.to_json(self.emit.is_beta), "content": []}
        await self.emit("response.output_item.added", response_id=self.id, output_index=0, item=empty)
        await self.emit("conversation.item.added", previous_item_id=self.previous_item_id, item=empty)
        await self.emit("response.content_part.added", **self._ids(), part=self._part_json(""))

    async def _close(self, status: str, details: dict | None, usage: dict | None) -> None:
        ids, text = self._ids(), self.part.text
        if self.speaks:
            await self.emit("response.output_audio.done", **ids)
            await self.emit("response.output_audio_transcript.done", **ids, transcript=text)
        else:
            await self.emit("response.output_text.done", **ids, text=text)
        await self.emit("response.content_part.done", **ids, part=self._part_json(text))
        item = self.item.to_json(self.emit.is_beta)
        await self.emit("response.output_item.done", response_id=self.id, output_index=0, item=item)
        await self.emit("conversation.item.done", previous_item_id=self.previous_item_id, item=item)
        await self.emit("response.done", response=self._json(status, details, usage, [item]))

    def _ids(self) -> dict:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    def _part_json(self, text: str) -> dict:
        return {"type": "audio", "transcript": text} if self.speaks else {"type": "text", "text": text}

    def _json(self, status: str, details: dict | None, usage: dict | None, output: list) -> dict:
        modalities = ["audio"] if self.speaks else ["text"]
        if self.emit.is_beta:
            modalities = ["text", "audio"] if self.speaks else ["text"]
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "usage": usage,
            "metadata": self.metadata,
            "conversation_id": None,
            "output_modalities" if not self.emit.is_beta else "modalities": modalities,
        }


def _usage(output: dict) -> dict:
    """Tokens as OpenAI counts them: the prompt's, and the answer's text tokens + audio tokens
    (codec frames, 12.5 per second of speech)."""
    num_text = len(output["token_ids"])
    num_audio = len(output["codes"]) if output.get("codes") is not None else 0
    num_in = len(output["prompt_token_ids"])
    return {
        "input_tokens": num_in,
        "output_tokens": num_text + num_audio,
        "total_tokens": num_in + num_text + num_audio,
        "input_token_details": {"cached_tokens": 0},
        "output_token_details": {"text_tokens": num_text, "audio_tokens": num_audio},
    }
