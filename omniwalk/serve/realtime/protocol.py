"""The Realtime protocol's client events (parsed strictly) and server events (named per dialect).

Client events are JSON text frames; each is parsed by a pydantic model that mirrors OpenAI's (GA
and beta field spellings both accepted: ``output_modalities`` / ``modalities``,
``audio.input.format`` / ``input_audio_format``, ``output_text`` / ``text`` parts, ...). A bad
event raises ``APIError`` (the session turns it into an ``error`` event; the socket stays open).

Server events are spelled in the client's dialect: GA by default, beta when the client asked for
``OpenAI-Beta: realtime=v1`` (what the SDK's ``client.beta.realtime`` sends):

    GA                                       beta
    response.output_audio.delta / .done      response.audio.delta / .done
    response.output_audio_transcript.*       response.audio_transcript.*
    response.output_text.delta / .done       response.text.delta / .done
    conversation.item.added (+ .done)        conversation.item.created (no .done)
    content type output_audio / output_text  audio / text
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, PrivateAttr, StringConstraints, ValidationError

from omniwalk.serve import schemas as s
from omniwalk.serve.errors import APIError, bad_request, validation_error

ItemId = Annotated[str, StringConstraints(min_length=1, max_length=128)]
MaxTokens = s.Count | Literal["inf"]
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
ToolChoiceOption = Literal["auto", "none", "required"]
MAX_TOOLS = 128


# ---- session and response fields ----


class AudioFormat(s.Strict):
    type: str | None = None  # "audio/pcm" is the one served
    rate: int | None = None  # 24000


class TurnDetection(s.Strict):
    type: Literal["server_vad", "semantic_vad"]
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    prefix_padding_ms: Annotated[int, Field(ge=0, le=10_000)] | None = None
    silence_duration_ms: Annotated[int, Field(ge=20, le=10_000)] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None  # refused when set
    eagerness: Literal["low", "medium", "high", "auto"] | None = None  # semantic_vad's
    # omniwalk's: the quiet after which the answer is prepared, unsent (0 or null: no preemption)
    preemptive_silence_ms: Annotated[int, Field(ge=0, le=10_000)] | None = None


class AudioInput(s.Strict):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: dict | None = None  # {"model", "language", "prompt"}: the served model transcribes
    noise_reduction: dict | None = None  # refused when set


class AudioOutput(s.Strict):
    format: AudioFormat | None = None
    voice: s.VoiceName | dict | None = None
    speed: float | None = None  # 1.0 only


class AudioConfig(s.Strict):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class FunctionTool(s.Strict):
    """A function the model may call (realtime's flat shape; chat nests it under ``function``)."""

    type: Literal["function"] | None = None
    name: FunctionName
    description: str | None = None
    parameters: dict | None = None  # a JSON Schema (checked by the grammar engine when a response is built)


class ToolChoiceFunction(s.Strict):
    type: Literal["function"]
    name: FunctionName


class Sampling(s.Strict):
    """omniwalk's sampling fields, accepted in a session and a response as in chat's extra body. The
    model family's own fields (``ModelInfo.request_fields``, e.g. a speech sampler's temperature) pass as
    extras: the family's chat schema checks them when a response is built (``engine_request``)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    seed: s.Seed | None = None

    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: s.TopP | None = None
    top_k: s.TopK | None = None
    repetition_penalty: s.Penalty | None = None
    min_tokens: s.NonNegativeCount | None = None
    ignore_eos: bool | None = None


class ResponseFields(Sampling):
    output_modalities: list[Literal["text", "audio"]] | None = None  # GA
    modalities: list[Literal["text", "audio"]] | None = None  # beta
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None  # GA
    max_response_output_tokens: MaxTokens | None = None  # beta
    voice: s.VoiceName | None = None  # beta
    output_audio_format: str | None = None  # beta
    audio: AudioConfig | None = None  # GA: audio.output.{voice, format}
    conversation: str | None = None  # "auto" only: out-of-band responses are not served
    input: list | None = None  # refused when set (out-of-band input)
    metadata: dict[str, str] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceOption | ToolChoiceFunction | None = None


class SessionFields(ResponseFields):
    type: Literal["realtime"] | None = None  # GA (transcription sessions are not served)
    object: str | None = None
    id: str | None = None
    model: s.ModelName | None = None
    input_audio_format: str | None = None  # beta
    turn_detection: TurnDetection | None = None  # beta
    input_audio_transcription: dict | None = None  # beta
    input_audio_noise_reduction: dict | None = None  # beta; refused when set
    speed: float | None = None
    expires_at: int | None = None
    # accepted and ignored: they change nothing a client can observe here
    tracing: str | dict | None = None
    truncation: str | dict | None = None
    include: list[str] | None = None
    prompt: dict | None = None  # refused when set
    client_secret: dict | None = None


# ---- conversation items ----


class ContentPart(s.Strict):
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None  # base64 PCM16 24 kHz
    transcript: str | None = None


class Item(s.Strict):
    """A message, a function call or a function call's output: one flat model (as beta's), so that
    a field a type needs is named by itself when missing (``conversation.item_from_client``)."""

    id: ItemId | None = None
    type: Literal["message", "function_call", "function_call_output"]
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = None  # a message's
    content: Annotated[list[ContentPart], Field(min_length=1, max_length=64)] | None = None  # a message's
    call_id: ItemId | None = None  # a function call's (or its output's)
    name: FunctionName | None = None  # a function call's
    arguments: str | None = None  # a function call's: a JSON object
    output: str | None = None  # a function call output's


# ---- client events ----


class ClientEvent(s.Strict):
    event_id: Annotated[str, StringConstraints(max_length=128)] | None = None


class SessionUpdate(ClientEvent):
    """``refused``: the invalid fields left out of ``session``, one error each (``parse``)."""

    type: Literal["session.update"]
    session: SessionFields
    _refused: list[APIError] = PrivateAttr(default_factory=list)

    @property
    def refused(self) -> list[APIError]:
        return self._refused


class BufferCommit(ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class BufferClear(ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(ClientEvent):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: ItemId | None = None


class ItemTruncate(ClientEvent):
    type: Literal["conversation.item.truncate"]
    item_id: ItemId
    content_index: Annotated[int, Field(ge=0, le=64)]
    audio_end_ms: Annotated[int, Field(ge=0, le=2**31 - 1)]


class ItemDelete(ClientEvent):
    type: Literal["conversation.item.delete"]
    item_id: ItemId


class ResponseCreate(ClientEvent):
    type: Literal["response.create"]
    response: ResponseFields | None = None


class ResponseCancel(ClientEvent):
    type: Literal["response.cancel"]
    response_id: ItemId | None = None


class BufferAppend(ClientEvent):
    """Parsed by hand (``parse``): its audio may be megabytes of base64."""

    type: Literal["input_audio_buffer.append"]
    audio: str


EVENTS = {
    cls.model_fields["type"].annotation.__args__[0]: cls
    for cls in (
        SessionUpdate,
        BufferAppend,
        BufferCommit,
        BufferClear,
        ItemCreate,
        ItemTruncate,
        ItemDelete,
        ResponseCreate,
        ResponseCancel,
    )
}


def parse(text: str | bytes) -> ClientEvent:
    """One client frame -> its event; APIError (with the client's event_id when it had one) if bad."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the event is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise bad_request("an event must be a JSON object", code="invalid_type")
    kind, event_id = raw.get("type"), raw.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    try:
        if not isinstance(kind, str) or kind not in EVENTS:
            raise bad_request(f"unknown event type {kind!r}; expected one of {sorted(EVENTS)}", "type")
        if kind == "input_audio_buffer.append":
            return _append(raw, event_id)
        if kind == "session.update":
            return _session_update(raw)
        return EVENTS[kind].model_validate_json(text)
    except ValidationError as e:
        raise _with_event_id(validation_error(e), event_id) from None
    except APIError as e:
        raise _with_event_id(e, event_id) from None


def _append(raw: dict, event_id: str | None) -> BufferAppend:
    audio = raw.get("audio")
    if not isinstance(audio, str):
        raise bad_request("audio: a base64 string is required", "audio", "missing_required_parameter")
    extra = set(raw) - {"type", "event_id", "audio"}
    if extra:
        raise bad_request(f"unrecognized event argument: {sorted(extra)[0]}", sorted(extra)[0], "unknown_parameter")
    return BufferAppend.model_construct(type="input_audio_buffer.append", audio=audio, event_id=event_id)


def _session_update(raw: dict) -> SessionUpdate:
    """A ``session.update`` without its invalid fields: each is left out, its error kept in
    ``refused``, so the rest of the update applies (what clients expect of a partial update). An
    error outside ``session`` (or ``session`` itself) refuses the event."""
    refused: list[APIError] = []
    for _ in range(MAX_REFUSED_FIELDS):
        try:
            event = SessionUpdate.model_validate_json(json.dumps(raw))
        except ValidationError as e:
            error = validation_error(e)
            path = _field_keys(error.param, error.code == "missing_required_parameter")
            if len(path) < 2 or path[0] != "session" or not _drop(raw, path):
                raise error from None
            if not any(error.param == r.param or error.param.startswith(f"{r.param}.") for r in refused):
                refused.append(error)
            continue
        event._refused = refused
        return event
    raise bad_request(f"the session holds more than {MAX_REFUSED_FIELDS} invalid fields", "session")


MAX_REFUSED_FIELDS = 32


def _field_keys(param: str | None, is_missing: bool) -> list[str]:
    """'session.tools[0].type' -> ['session', 'tools'] (the object key a list index is under); a
    missing field's parent: 'session.audio.input.turn_detection.type' -> [..., 'turn_detection']."""
    keys = (param or "").split("[", 1)[0].split(".")
    cut = "[" not in (param or "") and is_missing
    return keys[:-1] if cut else keys


def _drop(raw: dict, path: list[str]) -> bool:
    """Remove ``raw``'s value at ``path`` (False: there is none to remove)."""
    parent = raw
    for key in path[:-1]:
        parent = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(parent, dict) or path[-1] not in parent:
        return False
    del parent[path[-1]]
    return True


def _with_event_id(e: APIError, event_id: str | None) -> APIError:
    e.event_id = event_id
    return e


# ---- server events ----

BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,  # beta has no such event
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def server_event(kind: str, is_beta: bool, **fields) -> dict | None:
    """A server event in the dialect (None: the dialect has no such event)."""
    if is_beta:
        kind = BETA_NAMES.get(kind, kind)
        if kind is None:
            return None
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(e: APIError) -> dict:
    error = e.body()["error"]
    return {"type": "error", "event_id": new_id("event"), "error": {**error, "event_id": getattr(e, "event_id", None)}}
