"""One Realtime session: client events in (one at a time, in order), server events out.

    session.update               -> session.updated
    input_audio_buffer.append    -> (server VAD) input_audio_buffer.speech_started / speech_stopped,
                                    then as a commit; speech starting while a response plays
                                    cancels it first (barge-in: response.done "cancelled",
                                    reason "turn_detected") when interrupt_response is on
    input_audio_buffer.commit    -> input_audio_buffer.committed, conversation.item.added (+ .done)
                                    (after a VAD stop: then a response, when create_response is on;
                                    with transcription on, its events beside: ``transcription.py``)
    input_audio_buffer.clear     -> input_audio_buffer.cleared
    conversation.item.create     -> conversation.item.added (+ .done)
    conversation.item.truncate   -> conversation.item.truncated
    conversation.item.delete     -> conversation.item.deleted
    response.create / .cancel    -> the response's events (``response.py``)

An item that takes the conversation past its bounds first drops the oldest items (a
``conversation.item.deleted`` each), or is refused with an ``error`` event (``bounds.py``).
A bad event gets an ``error`` event naming the field (and the client's ``event_id``); the
session goes on. Events are handled one at a time, so what a handler emits (a barge-in's
``response.done`` included) is sent before anything a later client event causes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

from omniwalk.config import ServerConfig
from omniwalk.serve.errors import APIError, bad_request
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.bounds import AudioBudget, ConversationLimits, audio_size
from omniwalk.serve.realtime.conversation import Conversation, Item, Message, Part, item_from_client, pcm16
from omniwalk.serve.realtime.input_audio import InputAudio, samples_to_ms
from omniwalk.serve.realtime.preemption import Preemptions, Prepared
from omniwalk.serve.realtime.prompt import response_body
from omniwalk.serve.realtime.response import Response, engine_request, is_disconnect
from omniwalk.serve.realtime.settings import Settings
from omniwalk.serve.realtime.tools import check_tool_grammar, realtime_param
from omniwalk.serve.realtime.transcription import transcribe
from omniwalk.serve.realtime.vad import INPUT_RATE

error_log = logging.getLogger("omniwalk.error")
MIN_COMMIT_MS = 100  # a shorter buffer is not committed (OpenAI's rule too)


class Emitter:
    """Sends server events in the client's dialect, one frame at a time."""

    def __init__(self, send_text, is_beta: bool):
        self.send_text, self.is_beta = send_text, is_beta
        self.lock = asyncio.Lock()

    async def __call__(self, kind: str, **fields) -> None:
        event = p.server_event(kind, self.is_beta, **fields)
        if event is not None:
            await self.send(event)

    async def send(self, event: dict) -> None:
        async with self.lock:
            await self.send_text(json.dumps(event))


class Session:
    def __init__(
        self,
        emit: Emitter,
        cfg: ServerConfig,
        context,
        run_engine,
        expires_at: int,
        budget: AudioBudget,
        preemptions: Preemptions | None = None,
        model: str | None = None,
    ):
        """``model``: a LoRA adapter the handshake named (its answers run it); None: the base model."""
        self.emit, self.cfg, self.context, self.run_engine = emit, cfg, context, run_engine
        self.preemptions = preemptions  # the server's preemptive answers and responses (None: not counted)
        self.prepared: Prepared | None = None  # an answer started on a tentative end of turn
        self.settings = Settings.defaults(cfg, model or context.model_name, expires_at)
        self.conversation = Conversation(ConversationLimits.from_config(cfg), budget, cfg.realtime_max_media_wait_s)
        self.context = dataclasses.replace(context, audio_memo=self.conversation.memo)  # (its audio by reference)
        self.audio = InputAudio(int(cfg.realtime_max_buffer_s * INPUT_RATE))
        self.audio.set_vad(self.settings.turn_detection.vad if self.settings.turn_detection else None)
        self.speech_item_id: str | None = None  # the user item VAD is hearing
        self.response: Response | None = None
        self.transcriptions: set[asyncio.Task] = set()

    @property
    def is_responding(self) -> bool:
        return self.response is not None and self.response.is_open

    async def start(self) -> None:
        await self.emit("session.created", session=self.settings.to_json(self.emit.is_beta))

    async def handle(self, frame: str | bytes) -> None:
        event = None
        try:
            event = p.parse(frame)
            await getattr(self, "on_" + event.type.replace(".", "_"))(event)
        except APIError as e:
            if event is not None:
                e.event_id = event.event_id
            await self.emit.send(p.error_event(e))
        except Exception as e:  # noqa: BLE001 - a fault of ours: logged, the session goes on
            error_log.error("unexpected error in a realtime session (%s)", self.settings.id, exc_info=e)
            internal = APIError(500, f"internal server error (session {self.settings.id})", code="internal_error")
            await self.emit.send(p.error_event(internal))

    async def close(self) -> None:
        await self._discard_prepared()
        for task in self.transcriptions:
            task.cancel()
        if self.response is not None:
            await self.response.cancel(None)
        self.conversation.close()

    # ---- session and input audio ----

    async def on_session_update(self, event: p.SessionUpdate) -> None:
        """Each invalid field gets its own ``error`` event; the rest applies, and ``session.updated``
        shows the settings as they are then."""
        before = self.settings
        settings, refused = before.updated(event.session, self.context)
        if settings.tools and {"tools", "tool_choice"} & event.session.model_fields_set:
            try:
                timeout_s = self.cfg.grammar_check_timeout_s
                await check_tool_grammar(settings.tools, settings.tool_choice, "session", timeout_s)
            except APIError as e:
                settings.tools, settings.tool_choice = before.tools, before.tool_choice
                refused.append(e)
        self.settings = settings
        if (before.turn_detection and before.turn_detection.vad) != (
            settings.turn_detection and settings.turn_detection.vad
        ):
            self.audio.set_vad(settings.turn_detection.vad if settings.turn_detection else None)
            self.speech_item_id = None
            await self._discard_prepared()
        for error in [*event.refused, *refused]:
            error.event_id = event.event_id
            await self.emit.send(p.error_event(error))
        await self.emit("session.updated", session=self.settings.to_json(self.emit.is_beta))

    async def on_input_audio_buffer_append(self, event: p.BufferAppend) -> None:
        samples = pcm16(event.audio, "audio", self.cfg.realtime_max_append_bytes)
        try:
            speech = self.audio.append(samples)
        except ValueError as e:
            raise bad_request(str(e), "audio", "input_audio_buffer_full") from None
        td = self.settings.turn_detection
        for s in speech:
            if s.kind == "tentative":
                await self._prepare(s.audio)
                continue
            if s.kind == "resume":
                await self._discard_prepared()
                continue
            if s.kind == "start":
                self.speech_item_id = p.new_id("item")
                await self.emit(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=samples_to_ms(s.sample),
                    item_id=self.speech_item_id,
                )
                if self.is_responding and td.interrupt_response:
                    await self.response.cancel("turn_detected")  # barge-in
                continue
            item_id, self.speech_item_id = self.speech_item_id or p.new_id("item"), None
            await self.emit("input_audio_buffer.speech_stopped", audio_end_ms=samples_to_ms(s.sample), item_id=item_id)
            prepared, self.prepared = self.prepared, None
            try:
                await self._commit(s.audio, item_id)
            except BaseException:
                if prepared is not None:
                    await prepared.discard()
                raise
            if td.create_response and not self.is_responding:
                await self._respond(p.ResponseFields(), prepared)
            elif prepared is not None:
                await prepared.discard()

    async def on_input_audio_buffer_commit(self, event: p.BufferCommit) -> None:
        held_ms = samples_to_ms(self.audio.num_buffered)
        if held_ms < MIN_COMMIT_MS:
            raise bad_request(
                f"the input audio buffer holds {held_ms} ms; a commit needs at least {MIN_COMMIT_MS} ms",
                None,
                "input_audio_buffer_commit_empty",
            )
        self.conversation.plan(audio_size(self.audio.num_buffered), self._kept())  # refused: the buffer stays
        await self._discard_prepared()
        item_id, self.speech_item_id = self.speech_item_id or p.new_id("item"), None
        await self._commit(self.audio.take(), item_id)

    async def on_input_audio_buffer_clear(self, event: p.BufferClear) -> None:
        await self._discard_prepared()
        self.audio.clear()
        self.speech_item_id = None
        await self.emit("input_audio_buffer.cleared")

    async def _commit(self, audio, item_id: str) -> None:
        item = Message(item_id, "user", [Part("audio", audio=audio)])
        await self._deleted(self.conversation.admit(item, keep=self._kept()))
        previous = self.conversation.previous_id(item_id)
        await self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        await self._item_added(item, previous)
        if self.settings.transcription is not None:
            self._transcribe(item)

    def _transcribe(self, item: Message) -> None:
        """Transcribe ``item`` beside the session; its audio stays decodable until then (deleted or not)."""
        memo, part = self.conversation.memo, item.audio_parts[0]
        memo.hold(part)
        task = asyncio.create_task(transcribe(self.emit, self.run_engine, self.context, item))
        self.transcriptions.add(task)
        task.add_done_callback(self._transcribed)
        task.add_done_callback(lambda _: memo.release(part.ref))

    def _transcribed(self, task: asyncio.Task) -> None:
        self.transcriptions.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not is_disconnect(error):
            error_log.error("a transcription failed (session %s)", self.settings.id, exc_info=error)

    async def _item_added(self, item: Item, previous: str | None) -> None:
        await self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.emit.is_beta))
        await self.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.emit.is_beta))

    # ---- conversation ----

    async def on_conversation_item_create(self, event: p.ItemCreate) -> None:
        item = item_from_client(event.item, "item", self.cfg.realtime_max_append_bytes)
        await self._deleted(self.conversation.admit(item, event.previous_item_id, self._kept()))
        await self._item_added(item, self.conversation.previous_id(item.id))

    def _kept(self) -> set[str]:
        """Items the conversation's bounds never drop: the answer being generated."""
        return self.response.item_ids if self.is_responding else set()

    async def _deleted(self, item_ids: list[str]) -> None:
        for item_id in item_ids:  # the oldest items, dropped to keep the conversation within its bounds
            await self.emit("conversation.item.deleted", item_id=item_id)

    async def on_conversation_item_truncate(self, event: p.ItemTruncate) -> None:
        self._check_not_responding(event.item_id)
        self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        await self.emit(
            "conversation.item.truncated",
            item_id=event.item_id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    async def on_conversation_item_delete(self, event: p.ItemDelete) -> None:
        self._check_not_responding(event.item_id)
        self.conversation.delete(event.item_id)
        await self.emit("conversation.item.deleted", item_id=event.item_id)

    def _check_not_responding(self, item_id: str) -> None:
        if self.is_responding and item_id in self.response.item_ids:
            raise bad_request("the item is being generated; cancel its response first", "item_id")

    # ---- responses ----

    async def on_response_create(self, event: p.ResponseCreate) -> None:
        if self.is_responding:
            raise bad_request(
                f"response {self.response.id} is in progress; cancel it or wait for response.done",
                None,
                "conversation_already_has_active_response",
            )
        await self._respond(event.response or p.ResponseFields())

    async def on_response_cancel(self, event: p.ResponseCancel) -> None:
        if not self.is_responding or event.response_id not in (None, self.response.id):
            raise bad_request("there is no response in progress to cancel", "response_id", "response_cancel_not_active")
        await self.response.cancel("client_cancelled")

    async def _respond(self, fields: p.ResponseFields, prepared: Prepared | None = None) -> None:
        """Start a response; on the engine run of ``prepared`` when it was started for this very request."""
        try:
            body, speaks = self._body(fields)
        except APIError:
            if prepared is not None:
                await prepared.discard()
            raise
        if prepared is not None and prepared.body == body:
            prepared.keep()
            request, options = prepared.request, prepared.options
        else:
            if prepared is not None:
                await prepared.discard()
                prepared = None
            try:
                request, options = await engine_request(body, self.context)
            except APIError as e:
                where = {k: "response" if k in fields.model_fields_set else "session" for k in ("tools", "tool_choice")}
                raise realtime_param(e, where["tools"], where["tool_choice"]) from None
        self.response = Response(
            self.emit,
            self.run_engine,
            request,
            self.conversation,
            speaks=speaks,
            parses_tools=options.parses_tools,
            metadata=fields.metadata,
            prepared=prepared,
        )
        self.response.start()
        if self.preemptions is not None:
            self.preemptions.track(self.response.task)

    def _body(self, fields: p.ResponseFields, pending: Item | None = None) -> tuple[dict, bool]:
        return response_body(self.settings, self.context, self.conversation, self.cfg, fields, pending)

    # ---- preemptive answers (``preemption.py``) ----

    async def _prepare(self, audio) -> None:
        """A tentative end of turn: start the answer the confirmed turn would get, unsent."""
        td = self.settings.turn_detection
        if self.prepared is not None or not td.create_response or self.is_responding:
            return
        if self.preemptions is not None and not self.preemptions.has_room:
            self.preemptions.count("skipped")  # (the server is busy: the confirmed turn starts the answer)
            return
        part = Part("audio", audio=audio)
        memo = self.conversation.memo
        memo.hold(part)  # (until the prepared answer is kept or discarded: the confirmed turn's item reuses it)
        try:
            body, _ = self._body(p.ResponseFields(), Message("pending", "user", [part]))
            context = dataclasses.replace(self.context, audio_memo=memo.without_waiting())
            request, options = await engine_request(body, context)
        except BaseException as e:
            memo.release(part.ref)
            if isinstance(e, APIError):
                return  # (the confirmed turn meets the same error, sent then)
            raise
        run = self.run_engine(request)
        self.prepared = Prepared(body, request, options, run, self.preemptions, lambda: memo.release(part.ref))

    async def _discard_prepared(self) -> None:
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            await prepared.discard()
