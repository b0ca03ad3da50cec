"""One response: the conversation as a chat-completions request, its engine run streamed as events.

The prompt is built exactly as ``POST /v1/chat/completions`` builds a chat with audio input
(``openai_api.chat_request``: the same checks, limits, media pool and engine request): the
session's instructions as the system turn, then every item (user audio as ``input_audio``
parts, earlier answers as their text, function calls and their outputs as chat's tool calls and
tool messages). An ``input_audio`` part carries a reference, not base64: the session decodes each
audio part once, in the media pool, and its later responses reuse the arrays
(``conversation.AudioMemo``). Its output items, in order of appearance:

- the message (the spoken or written answer), opened at its first text that is not blank or its
  first audio; a response without function calls always has it, with all its text (blank text is
  streamed once text follows it: around calls it is dropped);
- a function call per ``<tool_call>`` the model writes (when the request has tools and
  ``tool_choice`` is not "none"; the text is parsed as chat's is, by ``ToolCallStream``), whose
  text never reaches the message (nor its audio: the talker does not voice a call). A call cut
  off (max tokens, cancel) or found malformed after it started ends ``incomplete``; the parser
  gives a malformed call's text back as the message's, and the prompt leaves incomplete calls out.

Events, in order:

    response.created
    for the message, when it opens:
        response.output_item.added, conversation.item.added (beta: .created), response.content_part.added
    (response.output_audio_transcript.delta | response.output_audio.delta)*   or  response.output_text.delta*
    for each function call, when it opens:
        response.output_item.added, conversation.item.added, response.function_call_arguments.delta*
    at the end, for each output item in order: the message's
        response.output_audio.done, response.output_audio_transcript.done     or  response.output_text.done
        response.content_part.done, response.output_item.done, conversation.item.done (GA only)
    and each call's
        response.function_call_arguments.done, response.output_item.done, conversation.item.done (GA only)
    response.done  {status: completed | incomplete (max tokens) | cancelled | failed, output, usage}

``cancel`` (``response.cancel``, or speech starting while it plays) aborts the engine request at
once (its pages are freed at the engine's next step) and ends with ``response.done`` cancelled;
the items keep what was streamed so far, marked incomplete.
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
from omniwalk.serve.realtime.conversation import Conversation, FunctionCall, Message, Part
from omniwalk.serve.realtime.preemption import Prepared
from omniwalk.serve.run import EngineRun
from omniwalk.serve.wire import Delta, Finished
from omniwalk.structured.tools import Arguments, CallStart, Content, ToolCallStream

SAMPLES_PER_MS = 24  # output PCM16 at 24 kHz
error_log = logging.getLogger("omniwalk.error")


def is_disconnect(e: BaseException) -> bool:
    """Sending to a client that went away (what ends a session, not a fault)."""
    return isinstance(e, WebSocketDisconnect | OSError | RuntimeError)


async def engine_request(body: dict, ctx: api.Context) -> tuple[dict, api.ChatOptions]:
    """A chat-completions body (a dict) -> the engine request chat completions would send and its
    options (the body checked by the chat schema with the model family's own fields, as the HTTP
    route checks it)."""
    fields = ctx.info.request_fields if ctx.info is not None else {}
    try:
        chat = schemas.with_fields(schemas.ChatRequest, dict(fields)).model_validate_json(json.dumps(body))
    except ValidationError as e:
        raise validation_error(e) from None
    return await api.chat_request(chat, ctx)


class Response:
    def __init__(
        self,
        emit,
        run_engine,
        request: dict,
        conversation: Conversation,
        speaks: bool,
        parses_tools: bool = False,
        metadata: dict | None = None,
        prepared: Prepared | None = None,
    ):
        self.id = p.new_id("resp")
        self.prepared = prepared  # the engine run, started before the turn was confirmed (``preemption.py``)
        self.emit, self.run_engine, self.request = emit, run_engine, request
        self.conversation, self.speaks, self.metadata = conversation, speaks, metadata
        self.items: list[Message | FunctionCall] = []  # the output items, by output_index
        self.previous_ids: list[str | None] = []  # each output item's predecessor in the conversation
        self.message: Message | None = None
        self.part = Part("audio" if speaks else "text")
        self.calls: dict[int, FunctionCall] = {}  # by the parser's call index
        self.tool_calls = ToolCallStream() if parses_tools else None
        self.blank = ""  # blank text held until text follows (a call's neighbours go to no message)
        self.num_samples = 0  # audio streamed
        self.cancel_reason: str | None = None
        self.task: asyncio.Task | None = None
        self.is_done = False  # response.done is on its way: a new response may start (the task ends after it)

    @property
    def item_ids(self) -> set[str]:
        return {item.id for item in self.items}

    @property
    def is_open(self) -> bool:
        """Started and its ``response.done`` not yet sent."""
        return self.task is not None and not self.task.done() and not self.is_done

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def cancel(self, reason: str | None) -> None:
        """Stop it and wait for its last event (``reason`` None: the session is closing, send nothing)."""
        if self.task is None:
            return
        if self.is_open or (reason is None and not self.task.done()):  # (closing: not even its response.done)
            self.cancel_reason = reason
            self.task.cancel()
        (outcome,) = await asyncio.gather(self.task, return_exceptions=True)
        if isinstance(outcome, Exception) and not is_disconnect(outcome):
            error_log.error("a realtime response failed (%s)", self.id, exc_info=outcome)

    async def run(self) -> None:
        await self.emit("response.created", response=self._json("in_progress", None, None, []))
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
        if not self.calls:  # an answer: its message, with all its text
            if self.message is None:
                await self._open_message()
            if self.blank:
                await self._say(self.blank)
        if self.message is not None:
            self.message.status = "completed" if status == "completed" else "incomplete"
        made = {call.id for call in self.tool_calls.calls} if self.tool_calls else set()
        for call in self.calls.values():
            call.status = "completed" if call.call_id in made else "incomplete"
        await self._close(status, details, usage)

    async def _stream(self) -> dict:
        run: EngineRun = self.prepared.run if self.prepared else self.run_engine(self.request)
        try:
            event = await (self.prepared.first_event() if self.prepared else run.first_event())
            while not isinstance(event, Finished):
                await self._delta(event)
                event = await run.next_event()
            if self.tool_calls is not None:
                await self._pieces(self.tool_calls.finish())
            return event.output
        finally:
            await run.close()  # (a run still going is aborted in the engine)

    async def _delta(self, event: Delta) -> None:
        if event.kind == "text" and self.tool_calls is None:
            await self._text(event.data)
        elif event.kind == "text":
            await self._pieces(self.tool_calls.feed(event.data))
        elif event.kind == "audio":
            if self.message is None:
                await self._open_message()
            samples = np.asarray(event.data, np.float32)
            self.num_samples += len(samples)
            self.part.audio_ms = self.num_samples // SAMPLES_PER_MS
            delta = base64.b64encode(pcm16_bytes(samples)).decode()
            await self.emit("response.output_audio.delta", **self._ids(), delta=delta)

    async def _pieces(self, pieces: list) -> None:
        for piece in pieces:
            if isinstance(piece, Content):
                await self._text(piece.text)
            elif isinstance(piece, CallStart):
                await self._open_call(piece.index, piece.id, piece.name)
            elif isinstance(piece, Arguments):
                call = self.calls[piece.index]
                call.arguments += piece.text
                await self.emit(
                    "response.function_call_arguments.delta",
                    response_id=self.id,
                    item_id=call.id,
                    output_index=self.items.index(call),
                    call_id=call.call_id,
                    delta=piece.text,
                )

    async def _text(self, text: str) -> None:
        self.blank += text
        if not self.blank.strip():
            return
        text, self.blank = self.blank, ""
        if self.message is None:
            await self._open_message()
        await self._say(text)

    async def _say(self, text: str) -> None:
        self.part.text += text
        kind = "response.output_audio_transcript.delta" if self.speaks else "response.output_text.delta"
        await self.emit(kind, **self._ids(), delta=text)

    async def _open_message(self) -> None:
        self.message = Message(p.new_id("item"), "assistant", [self.part], "in_progress")
        await self._open(self.message, {**self.message.to_json(self.emit.is_beta), "content": []})
        await self.emit("response.content_part.added", **self._ids(), part=self._part_json(""))

    async def _open_call(self, index: int, call_id: str, name: str) -> None:
        call = self.calls[index] = FunctionCall(id=p.new_id("item"), call_id=call_id, name=name, status="in_progress")
        await self._open(call, call.to_json(self.emit.is_beta))

    async def _open(self, item: Message | FunctionCall, shown: dict) -> None:
        """An output item joins the conversation (at its end) and the response."""
        previous = self.conversation.add(item)
        self.items.append(item)
        self.previous_ids.append(previous)
        await self.emit("response.output_item.added", response_id=self.id, output_index=len(self.items) - 1, item=shown)
        await self.emit("conversation.item.added", previous_item_id=previous, item=shown)

    async def _close(self, status: str, details: dict | None, usage: dict | None) -> None:
        shown = []
        for index, (item, previous) in enumerate(zip(self.items, self.previous_ids, strict=True)):
            ids = {"response_id": self.id, "item_id": item.id, "output_index": index}
            if isinstance(item, Message):
                await self._close_message()
            else:
                await self.emit(
                    "response.function_call_arguments.done",
                    **ids,
                    call_id=item.call_id,
                    name=item.name,
                    arguments=item.arguments,
                )
            shown.append(item.to_json(self.emit.is_beta))
            await self.emit("response.output_item.done", response_id=self.id, output_index=index, item=shown[-1])
            await self.emit("conversation.item.done", previous_item_id=previous, item=shown[-1])
        self.is_done = True  # (set first: a client that hears response.done may create the next one at once)
        await self.emit("response.done", response=self._json(status, details, usage, shown))

    async def _close_message(self) -> None:
        ids, text = self._ids(), self.part.text
        if self.speaks:
            await self.emit("response.output_audio.done", **ids)
            await self.emit("response.output_audio_transcript.done", **ids, transcript=text)
        else:
            await self.emit("response.output_text.done", **ids, text=text)
        await self.emit("response.content_part.done", **ids, part=self._part_json(text))

    def _ids(self) -> dict:
        index = self.items.index(self.message)
        return {"response_id": self.id, "item_id": self.message.id, "output_index": index, "content_index": 0}

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
        "input_token_details": {
            "cached_tokens": output["num_cached_tokens"],
            "text_tokens": num_in - output["num_audio_prompt_tokens"],
            "audio_tokens": output["num_audio_prompt_tokens"],
        },
        "output_token_details": {"text_tokens": num_text, "audio_tokens": num_audio},
    }
