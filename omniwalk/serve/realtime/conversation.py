"""A session's conversation: its items, their JSON, and the chat messages the next turn's prompt
is built from.

Items are messages (user, assistant, system), function calls and function call outputs. A user
message holds text and/or audio (PCM16 24 kHz, kept whole: the model hears it again at every later
turn); an assistant message holds its text (or its audio's transcript) and the length of the audio
it spoke. As in chat completions, earlier answers reach the prompt as their text, function calls
as the ``tool_calls`` of the assistant message they follow (a turn's spoken text and its calls are
one chat message), and function call outputs as ``tool`` messages. A truncated answer (barge-in,
``conversation.item.truncate``) keeps the part of its transcript that was heard: the share of its
words equal to the share of its audio played (the model streams no word timings; an estimate,
said so in docs/realtime.md).

A user audio part reaches the chat body as its reference (``audio_ref``: a digest of its samples),
not as base64 WAV: the session's ``AudioMemo`` decodes each part once, in the media pool, and
every later response of the conversation reuses the arrays (``openai_api._decode`` resolves a
reference through the session's context only).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import json
import wave
from dataclasses import dataclass, field

import numpy as np

from omniwalk.media.budget import AUDIO_BYTES_PER_SAMPLE, DecodeTicket
from omniwalk.media.errors import MediaLimitError
from omniwalk.serve.errors import bad_request
from omniwalk.serve.media_pool import MediaPool
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.bounds import AudioBudget, ConversationLimits, Size, item_size, oldest_to_drop
from omniwalk.serve.realtime.vad import INPUT_RATE

# the fields each item type needs
ITEM_FIELDS = {
    "message": ("role", "content"),
    "function_call": ("name", "arguments"),
    "function_call_output": ("call_id", "output"),
}
ASSISTANT_TYPES = {"text": ("output_text", "text"), "audio": ("output_audio", "audio")}  # kind -> (GA, beta)
# an audio reference's prefix: ':' and '-' are outside base64's alphabet, so a chat body from an HTTP
# client that carries a reference is refused as invalid base64 (a 400), never resolved
AUDIO_REF_PREFIX = "omniwalk-audio:"


@dataclass
class Part:
    kind: str  # "text" | "audio"
    text: str = ""  # text, or the audio's transcript (a user's: when transcription is on)
    audio: np.ndarray | None = None  # a user's audio (int16 at 24 kHz)
    audio_ms: int = 0  # an assistant's audio: milliseconds spoken (truncated: played)
    ref: str = field(init=False, default="")  # a user's audio: its reference in chat bodies (``audio_ref``)

    def __post_init__(self):
        if self.audio is not None:
            self.ref = audio_ref(self.audio)


@dataclass
class Message:
    id: str
    role: str  # "user" | "assistant" | "system"
    parts: list[Part] = field(default_factory=list)
    status: str = "completed"  # | "in_progress" | "incomplete"

    @property
    def num_audio_bytes(self) -> int:
        return sum(part.audio.nbytes for part in self.parts if part.audio is not None)

    @property
    def num_text_bytes(self) -> int:
        return sum(len(part.text.encode()) for part in self.parts)

    def to_json(self, is_beta: bool) -> dict:
        content = []
        for part in self.parts:
            if self.role != "assistant":
                kind = "input_text" if part.kind == "text" else "input_audio"
                content.append(
                    {"type": kind, "text": part.text}
                    if part.kind == "text"
                    else {"type": kind, "transcript": part.text or None}
                )
            else:
                kind = ASSISTANT_TYPES[part.kind][int(is_beta)]
                content.append({"type": kind, "text" if part.kind == "text" else "transcript": part.text})
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "role": self.role,
            "status": self.status,
            "content": content,
        }

    def chat_message(self) -> dict | None:
        """This item as a chat-completions message (None: nothing to say)."""
        if self.role != "user":
            text = "".join(part.text for part in self.parts)
            return {"role": self.role, "content": text} if text or self.role == "system" else None
        content = []
        for part in self.parts:
            if part.kind == "text":
                content.append({"type": "text", "text": part.text})
            else:
                content.append({"type": "input_audio", "input_audio": {"data": part.ref}})
        return {"role": "user", "content": content}

    @property
    def audio_parts(self) -> list[Part]:
        """The parts holding a user's audio (an assistant's parts hold its transcript only)."""
        return [part for part in self.parts if part.audio is not None]


@dataclass
class FunctionCall:
    """The model calling a function (``arguments``: the JSON text of its arguments)."""

    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: str = "completed"
    num_audio_bytes = 0
    audio_parts = ()

    @property
    def num_text_bytes(self) -> int:
        return len(self.call_id) + len(self.name.encode()) + len(self.arguments.encode())

    def to_json(self, is_beta: bool) -> dict:
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "function_call",
            "status": self.status,
            "name": self.name,
            "call_id": self.call_id,
            "arguments": self.arguments,
        }

    def tool_call(self) -> dict:
        """As an entry of a chat assistant message's ``tool_calls``."""
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class FunctionCallOutput:
    """What a function call returned (the client ran it): a chat ``tool`` message."""

    id: str
    call_id: str
    output: str
    status: str = "completed"
    num_audio_bytes = 0
    audio_parts = ()

    @property
    def num_text_bytes(self) -> int:
        return len(self.call_id) + len(self.output.encode())

    def to_json(self, is_beta: bool) -> dict:
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "function_call_output",
            "status": self.status,
            "call_id": self.call_id,
            "output": self.output,
        }

    def chat_message(self) -> dict:
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.output}


Item = Message | FunctionCall | FunctionCallOutput


def audio_ref(samples: np.ndarray) -> str:
    """A user audio part's reference: a digest of its samples, the same for the same audio (the body
    of a preemptive answer equals the confirmed turn's: ``preemption.py``)."""
    return AUDIO_REF_PREFIX + hashlib.blake2b(samples.astype("<i2").tobytes(), digest_size=16).hexdigest()


@dataclass
class Memoised:
    """One audio reference's samples, who holds it, and its decoding (once asked for)."""

    audio: np.ndarray
    num_holders: int = 0
    decoding: asyncio.Future | None = None  # the pool's decode: a task the requests share
    ticket: DecodeTicket | None = None  # its cancel flag (the session ends)


class AudioMemo:
    """A session's user audio, decoded once. The first request that needs a part decodes it in the
    media pool (its limits and queue apply, a full queue waited for up to ``max_media_wait_s``;
    a part that fails is tried again by the next request),
    in a task of its own that requests share (a response and a transcription of one turn); every
    later request reuses the arrays. A request still counts each part against its own media budget
    (``max_request_decoded_bytes``), as a decode would. An entry lives while something holds its
    reference (a conversation item, a preemptive answer's turn, a transcription), so the arrays go
    when their items are deleted or the session ends."""

    def __init__(self, max_media_wait_s: float = 0.0):
        self.entries: dict[str, Memoised] = {}
        self.max_media_wait_s = max_media_wait_s  # (ServerConfig.realtime_max_media_wait_s)

    def without_waiting(self) -> AudioMemo:
        """The memo (the same entries) for a request that does not wait for a full media queue: a
        preemptive answer's, prepared while the session's events wait for it (then none is prepared)."""
        view = AudioMemo()
        view.entries = self.entries
        return view

    def holds(self, data: str) -> bool:
        return data in self.entries

    def hold(self, part: Part) -> None:
        self.entries.setdefault(part.ref, Memoised(part.audio)).num_holders += 1

    def release(self, ref: str) -> None:
        """Let go of ``ref`` (unknown: nothing; the session's memo was closed). A decoding still running
        when the last holder goes finishes for nobody: the pool bounds it."""
        entry = self.entries.get(ref)
        if entry is not None:
            entry.num_holders -= 1
            if entry.num_holders == 0:
                del self.entries[ref]

    async def decode(self, ref: str, where: str, pool: MediaPool, ticket: DecodeTicket) -> dict:
        """The array part of the held audio ``ref`` (``where``: the content part, named in errors)."""
        entry = self.entries[ref]
        try:
            ticket.reserve(entry.audio.size * AUDIO_BYTES_PER_SAMPLE)  # (as the pool counts its WAV)
        except MediaLimitError as e:
            raise bad_request(f"{where}: {e}", where) from None
        if entry.decoding is None:
            entry.ticket = DecodeTicket(pool.limits.max_request_decoded_bytes)
            data = base64.b64encode(wav_bytes(entry.audio)).decode()
            decode = pool.decode(
                "audio", data, where, is_base64=True, ticket=entry.ticket, max_wait_s=self.max_media_wait_s
            )
            entry.decoding = asyncio.ensure_future(decode)
        decoding = entry.decoding
        try:
            return dict(await asyncio.shield(decoding))  # (a request that ends leaves it to the others)
        except Exception:  # (not this request's own cancellation: the decoding stays for the others)
            if entry.decoding is decoding:
                entry.decoding = None  # (a queue full too long, a refused part: the next request tries again)
            raise

    def close(self) -> None:
        """The session ends: decodings stop (a queued one is dropped, a running one stops at its next chunk)."""
        for entry in self.entries.values():
            if entry.decoding is not None and not entry.decoding.done():
                entry.ticket.cancel()
                entry.decoding.cancel()
        self.entries.clear()  # (the views' too)


def wav_bytes(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(INPUT_RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def pcm16(data: str, param: str, max_bytes: int) -> np.ndarray:
    """Base64 PCM16 (little-endian, mono, 24 kHz) -> int16 samples; 400 APIError naming ``param``."""
    if len(data) > (max_bytes + 2) // 3 * 4:
        raise bad_request(
            f"{param} holds more than {max_bytes} bytes of audio; send it in smaller parts", param, "audio_too_large"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{param} is not valid base64", param) from None
    if len(raw) % 2:
        raise bad_request(f"{param}: PCM16 audio has an even number of bytes, got {len(raw)}", param)
    return np.frombuffer(raw, "<i2").astype(np.int16)


def item_from_client(item: p.Item, where: str, max_bytes: int) -> Item:
    """A ``conversation.item.create`` item -> an Item (refusing fields its type cannot have)."""
    required = ITEM_FIELDS[item.type]
    allowed = (*required, "call_id") if item.type == "function_call" else required  # (a call's id: ours if none)
    for name in ("role", "content", "call_id", "name", "arguments", "output"):
        if getattr(item, name) is not None and name not in allowed:
            raise bad_request(f"a {item.type} item has no {name}", f"{where}.{name}", "unknown_parameter")
        if getattr(item, name) is None and name in required:
            raise bad_request(f"a {item.type} item needs its {name}", f"{where}.{name}", "missing_required_parameter")
    item_id = item.id or p.new_id("item")
    if item.type == "function_call":
        _check_arguments(item.arguments, f"{where}.arguments")
        call_id = item.call_id or p.new_id("call")
        status = item.status or "completed"
        return FunctionCall(id=item_id, call_id=call_id, name=item.name, arguments=item.arguments, status=status)
    if item.type == "function_call_output":
        return FunctionCallOutput(item_id, item.call_id, item.output)
    status = item.status or "completed" if item.role == "assistant" else "completed"
    return Message(item_id, item.role, _parts(item, where, max_bytes), status)


def _check_arguments(arguments: str, param: str) -> None:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise bad_request("a function call's arguments are a JSON object (as text)", param)


def _parts(item: p.Item, where: str, max_bytes: int) -> list[Part]:
    allowed = {
        "user": ("input_text", "input_audio"),
        "system": ("input_text",),
        "assistant": ("output_text", "text", "output_audio", "audio"),
    }[item.role]
    parts = []
    for i, c in enumerate(item.content):
        param = f"{where}.content[{i}]"
        if c.type not in allowed:
            raise bad_request(f"a {item.role} item cannot hold {c.type!r}; use {list(allowed)}", f"{param}.type")
        if c.type == "input_audio":
            if c.audio is None:
                raise bad_request("input_audio content needs its audio", f"{param}.audio", "missing_required_parameter")
            parts.append(Part("audio", audio=pcm16(c.audio, f"{param}.audio", max_bytes)))
        elif c.type in ("output_audio", "audio"):
            parts.append(Part("audio", text=c.transcript or ""))
        elif c.text is None:
            raise bad_request(f"{c.type} content needs its text", f"{param}.text", "missing_required_parameter")
        else:
            parts.append(Part("text", text=c.text))
    return parts


class Conversation:
    """The items, within the session's limits and the server's audio budget (``bounds.py``)."""

    def __init__(self, limits: ConversationLimits, budget: AudioBudget, max_media_wait_s: float = 0.0):
        """``max_media_wait_s``: how long its audio waits for a place in a full media queue."""
        self.items: list[Item] = []
        self.limits, self.budget = limits, budget
        self.memo = AudioMemo(max_media_wait_s)  # its items' user audio, decoded once for all its responses

    @property
    def num_audio_bytes(self) -> int:
        return sum(item_size(item).audio_bytes for item in self.items)

    def plan(self, new: Size, keep: set[str] = frozenset()) -> list[Item]:
        """The oldest items to drop for an item of size ``new`` (none of ``keep``); raises the
        APIError that refuses it (too large alone, or past the server's budget)."""
        dropped = oldest_to_drop(self.items, new, self.limits, set(keep))
        self.budget.check(new.audio_bytes, sum(item_size(item).audio_bytes for item in dropped))
        return dropped

    def admit(self, item: Item, previous_item_id: str | None = None, keep: set[str] = frozenset()) -> list[str]:
        """Add ``item`` (after ``previous_item_id``, default: at the end), first dropping the oldest
        items it needs room for; returns the dropped items' ids. Nothing changes when it is refused."""
        if any(i.id == item.id for i in self.items):
            raise bad_request(f"an item with id {item.id!r} already exists", "item.id")
        if previous_item_id is not None:
            self.index(previous_item_id, "previous_item_id")
        dropped = self.plan(item_size(item), keep | {previous_item_id})
        for old in dropped:
            self.delete(old.id)
        self.add(item, previous_item_id)
        return [old.id for old in dropped]

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (default: at the end); returns its predecessor's id."""
        if any(i.id == item.id for i in self.items):
            raise bad_request(f"an item with id {item.id!r} already exists", "item.id")
        index = len(self.items) if previous_item_id is None else self.index(previous_item_id, "previous_item_id") + 1
        self.items.insert(index, item)
        self.budget.hold(item_size(item).audio_bytes)
        for part in item.audio_parts:
            self.memo.hold(part)
        return self.items[index - 1].id if index else None

    def previous_id(self, item_id: str) -> str | None:
        index = self.index(item_id)
        return self.items[index - 1].id if index else None

    def index(self, item_id: str, param: str = "item_id") -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise bad_request(f"no item with id {item_id!r} in the conversation", param, "item_not_found")

    def delete(self, item_id: str) -> None:
        item = self.items.pop(self.index(item_id))
        self.budget.release(item_size(item).audio_bytes)
        for part in item.audio_parts:
            self.memo.release(part.ref)

    def close(self) -> None:
        """Give the items' audio back to the server's budget (the session ends)."""
        for item in self.items:
            self.budget.release(item_size(item).audio_bytes)
        self.items = []
        self.memo.close()

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        item = self.items[self.index(item_id)]
        if (
            not isinstance(item, Message)
            or item.role != "assistant"
            or content_index >= len(item.parts)
            or item.parts[content_index].kind != "audio"
        ):
            raise bad_request("only an assistant item's audio content can be truncated", "content_index")
        part = item.parts[content_index]
        if audio_end_ms > part.audio_ms:
            raise bad_request(
                f"audio_end_ms {audio_end_ms} is past the audio's end ({part.audio_ms} ms)", "audio_end_ms"
            )
        words = part.text.split(" ")
        kept = round(len(words) * audio_end_ms / part.audio_ms) if part.audio_ms else 0
        part.text, part.audio_ms = " ".join(words[:kept]), audio_end_ms

    def chat_messages(self) -> list[dict]:
        """The items as chat messages: function calls join the assistant message just before them
        (its text stripped, as a chat completion's content is beside its tool calls), or make one;
        an incomplete call (cut off, malformed, cancelled) was never made and is left out."""
        messages, turn = [], None  # turn: the assistant message the next function call joins
        for item in self.items:
            if isinstance(item, FunctionCall) and item.status == "incomplete":
                continue
            if isinstance(item, FunctionCall):
                if turn is None:
                    turn = {"role": "assistant", "content": None}
                    messages.append(turn)
                elif "tool_calls" not in turn:
                    turn["content"] = turn["content"].strip() or None
                turn.setdefault("tool_calls", []).append(item.tool_call())
                continue
            message = item.chat_message()
            turn = message if isinstance(item, Message) and item.role == "assistant" else None
            if message is not None:
                messages.append(message)
        return messages
