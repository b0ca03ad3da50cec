"""OpenAI chat-completions semantics: a validated body -> engine request, engine output -> response.

One choice per response. Text only: ``message.content`` / ``delta.content``. Tools and structured
outputs pass to the engine as OpenAI shapes them; their grammar is checked here first (a 400 naming
the field), and a request with tools has its answer read as content and tool calls
(``tool_responses``). With audio output,
as OpenAI does, the text is the audio's transcript only (``content`` is null):
``message.audio`` = {id, data = the whole file in the requested format, expires_at, transcript};
streamed, ``delta.audio`` = {id, transcript} for text and {id, data = base64 PCM16 at the model's
sample rate} for sound. Assistant audio may be referenced by id in a later request (``audio_store``).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from pydantic import BaseModel

from omniwalk.config import ServerConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.media.budget import DecodeTicket
from omniwalk.models.family import ModelInfo
from omniwalk.serve import schemas as s
from omniwalk.serve import tool_responses
from omniwalk.serve.audio_format import encode_audio, pcm16_bytes
from omniwalk.serve.audio_store import AudioStore
from omniwalk.serve.errors import APIError, bad_request, unsupported
from omniwalk.serve.media_pool import MediaPool
from omniwalk.serve.voice_aliases import alias_table
from omniwalk.structured import grammars

# Body fields passed to the engine as they are (sampling), beside the family's own (ModelInfo.request_fields).
PASSTHROUGH = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "stop",
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "top_logprobs",
)
# Tools and structured outputs, passed to the engine as plain dicts in OpenAI's shapes.
STRUCTURED = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "structured_outputs")
# The longest a request's grammar may take to be checked (compiled) before the engine sees it.
# OpenAI features this server does not have (a 400 that says so when one is set)
UNSUPPORTED = {
    "functions": "the legacy function calling (use tools)",
    "function_call": "the legacy function calling (use tool_choice)",
    "logit_bias": "logit_bias",
    "prediction": "predicted outputs",
    "reasoning_effort": "reasoning_effort",
    "web_search_options": "web search",
}


@dataclass(frozen=True)
class ChatOptions:
    """What shapes the response (not the generation)."""

    id: str
    model: str
    stream: bool
    include_usage: bool
    audio_format: str | None  # None: text only
    parses_tools: bool = False  # the answer is read as content and tool calls (tools, tool_choice not "none")


class AudioMemo(Protocol):
    """A realtime session's audio, decoded once (``realtime.conversation.AudioMemo``): its chat bodies
    carry references in ``input_audio.data``, which only its own context resolves."""

    def holds(self, data: str) -> bool: ...

    def decode(self, data: str, where: str, pool: MediaPool, ticket: DecodeTicket) -> Awaitable[dict]: ...


@dataclass
class Context:
    """What turning a body into an engine request needs from the server."""

    cfg: ServerConfig
    pool: MediaPool
    store: AudioStore
    info: ModelInfo | None  # what the loaded model offers (from the engine process; None while it starts)
    adapters: tuple[str, ...] = ()  # the LoRA adapters served beside the base model (a request's ``model``)
    audio_memo: AudioMemo | None = None  # a realtime session's (its audio by reference); None: an HTTP request

    @property
    def model_name(self) -> str:
        return self.cfg.served_model_name or (self.info.name if self.info else "")

    @property
    def voices(self) -> tuple[str, ...]:
        """The model's voices (lower case; none while it starts or when it does not speak)."""
        return tuple(self.info.voices) if self.info else ()

    def voice(self, name: str | None, param: str) -> str | None:
        """A requested voice -> the checkpoint's voice that speaks it: one of its voices, or an alias
        (OpenAI's names, ``voice_aliases.py``); None stays None (the checkpoint's default). 400 naming
        ``param`` for any other name."""
        if name is None or name.lower() in self.voices:
            return None if name is None else name.lower()
        aliases = alias_table(self.cfg.voice_aliases, self.voices)
        if name.lower() not in aliases:
            known = ", ".join((*self.voices, *sorted(aliases)))
            raise bad_request(f"unknown voice {name!r}; available: {known}", param)
        return aliases[name.lower()]


def check_model(model: str | None, ctx: Context) -> str:
    """The model a request names -> the name its answer carries: the base model's (also when it names
    none) or a LoRA adapter's; 404 ``model_not_found`` for any other."""
    if model is None or model == ctx.model_name:
        return ctx.model_name
    if model not in ctx.adapters:
        served = ", ".join(repr(name) for name in (ctx.model_name, *ctx.adapters))
        message = f"the model {model!r} does not exist; this server serves {served}"
        raise APIError(404, message, param="model", code="model_not_found")
    return model


def adapter_fields(model: str | None, ctx: Context) -> dict:
    """The engine request's fields for the model a request names: ``lora`` for an adapter, none for the base."""
    return {"lora": model} if check_model(model, ctx) != ctx.model_name else {}


def check_speech(body, ctx: Context, voice: str | None, voice_param: str, audio_param: str) -> dict:
    """The speech fields every audio-out request shares -> engine request fields."""
    if "audio" not in ctx.info.output_modalities:
        raise bad_request(f"this model has no audio output ({ctx.model_name!r} answers with text only)", audio_param)
    speech = {"voice": ctx.voice(voice, voice_param)}
    if "max_audio_frames" in ctx.info.request_fields:
        speech["max_audio_frames"] = body.max_audio_frames or ctx.cfg.max_audio_frames_limit
        _check_limit("max_audio_frames", speech["max_audio_frames"], ctx.cfg.max_audio_frames_limit)
    return speech


async def chat_request(body: s.ChatRequest, ctx: Context, receive=None) -> tuple[dict, ChatOptions]:
    """A validated chat body -> (engine request, response options); APIError when it cannot be served.
    ``receive`` (the ASGI channel, its body read) tells of a client hanging up while media decodes."""
    model = check_model(body.model, ctx)
    _check_unsupported(body)
    modalities = sorted(set(body.modalities or ["text"]))
    if modalities not in (["text"], ["audio", "text"]):
        raise bad_request("modalities must be ['text'] or ['text', 'audio']", "modalities")
    request = {"request_id": f"chatcmpl-{uuid.uuid4().hex}", "modalities": modalities, "stream": bool(body.stream)}
    request.update(adapter_fields(body.model, ctx))
    passed = (*PASSTHROUGH, *ctx.info.request_fields)
    request.update({k: getattr(body, k) for k in passed if getattr(body, k) is not None})
    max_tokens = body.max_completion_tokens or body.max_tokens or ctx.cfg.default_max_tokens
    _check_limit(
        "max_completion_tokens" if body.max_completion_tokens else "max_tokens", max_tokens, ctx.cfg.max_tokens_limit
    )
    request["max_tokens"] = max_tokens
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise bad_request("min_tokens must not exceed max_tokens", "min_tokens")
    audio_format = None
    if "audio" in modalities:
        audio = body.audio or s.AudioOutput()
        audio_format = audio.format
        request.update(check_speech(body, ctx, audio.voice, "audio.voice", "modalities"))
    structured = structured_fields(body)
    await check_grammar(structured, ctx.cfg.grammar_check_timeout_s)
    request.update(structured)
    request["messages"] = await engine_messages(body.messages, ctx, receive)
    options = ChatOptions(
        id=request["request_id"],
        model=model,
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        audio_format=audio_format,
        parses_tools=bool(body.tools) and body.tool_choice != "none",
    )
    return request, options


def structured_fields(body: s.ChatRequest) -> dict:
    """The body's tools and structured-output fields that are set, as plain dicts and lists."""
    out = {}
    for name in STRUCTURED:
        value = getattr(body, name)
        if isinstance(value, list):
            out[name] = [_plain(item) for item in value]
        elif value is not None:
            out[name] = _plain(value)
    return out


def _plain(value):
    return value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value


async def check_grammar(structured: dict, timeout_s: float) -> None:
    """The constraint of a request's ``structured_fields``, compiled off the event loop within ``timeout_s``
    (``ServerConfig.grammar_check_timeout_s``): a schema, regex or grammar that cannot be compiled (or takes
    too long to), or an unknown tool name, is a 400 naming the field before the engine sees it."""
    if not structured:
        return
    try:
        await asyncio.wait_for(asyncio.to_thread(grammars.constraint_of, structured), timeout_s)
    except InvalidRequestError as e:
        raise bad_request(str(e), e.param) from None
    except TimeoutError:
        raise bad_request("the grammar took too long to compile", _constrained_field(structured)) from None


def _constrained_field(structured: dict) -> str:
    """The field a request's grammar comes from (for a 400 about it)."""
    if "structured_outputs" in structured:
        return f"structured_outputs.{next(iter(structured['structured_outputs']))}"
    if structured.get("response_format", {}).get("type", "text") != "text":
        return "response_format"
    return "tools"


def _check_unsupported(body: s.ChatRequest) -> None:
    for name, what in UNSUPPORTED.items():
        if getattr(body, name) not in (None, [], {}):
            raise unsupported(name, what)
    if body.n not in (None, 1):
        raise APIError(400, "only n=1 is supported", param="n", code="unsupported_value")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name) not in (None, 0, 0.0):
            raise APIError(
                400, f"{name} is not supported (use repetition_penalty)", param=name, code="unsupported_value"
            )


def _check_limit(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise bad_request(f"{name} = {value} exceeds this server's limit of {limit}", name)


async def engine_messages(messages: list, ctx: Context, receive=None) -> list[dict]:
    """Validated messages -> the engine's (developer as system, assistant audio as its transcript,
    every media part decoded to arrays by the pool, all of a request's parts concurrently, within
    one request budget: ``DecodeTicket``)."""
    out, jobs, ticket = [], [], DecodeTicket(ctx.pool.limits.max_request_decoded_bytes)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, s.FunctionMessage):
            raise unsupported(f"{where}.role", "the legacy function calling (use tool messages)")
        if isinstance(m, s.SystemMessage):
            out.append({"role": "system", "content": _text(m.content)})
        elif isinstance(m, s.AssistantMessage):
            out.append(_assistant_message(m, where, ctx.store))
        elif isinstance(m, s.ToolMessage):
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": _text(m.content)})
        elif isinstance(m.content, str):
            out.append({"role": "user", "content": m.content})
        else:
            parts = []
            for j, part in enumerate(m.content):
                if isinstance(part, s.TextPart):
                    parts.append({"type": "text", "text": part.text})
                else:
                    parts.append(None)
                    jobs.append((parts, len(parts) - 1, _decode(part, f"{where}.content[{j}]", ctx, ticket)))
            out.append({"role": "user", "content": parts})
    decoded = await _decode_all([job for _, _, job in jobs], ticket, receive)
    for (parts, index, _), part in zip(jobs, decoded, strict=True):
        parts[index] = part
    return out


async def _decode_all(jobs: list, ticket: DecodeTicket, receive) -> list[dict]:
    """All of a request's media parts at once. If the request ends first (a part refused, its task
    cancelled, or its client gone: a 499), the ticket stops the other parts' decoding."""
    decoding = asyncio.gather(*jobs)
    hangup = asyncio.ensure_future(_hung_up(receive)) if receive is not None and jobs else None
    try:
        if hangup is None:  # (no connection to watch: the realtime path, a request without media)
            return await decoding
        await asyncio.wait({decoding, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if not decoding.done():
            ticket.cancel()  # (first: running items stop at their next frame or chunk)
            decoding.cancel()
            await asyncio.gather(decoding, return_exceptions=True)
            raise APIError(499, "the client closed the request while its media was decoded", code="client_closed")
        return await decoding
    except BaseException:
        ticket.cancel()
        decoding.cancel()
        raise
    finally:
        if hangup is not None:
            hangup.cancel()


async def _hung_up(receive) -> None:
    """Returns when the client disconnects (the body is read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _decode(part, where: str, ctx: Context, ticket: DecodeTicket):
    """A media part -> its array part, from the pool (images and video resized for the served family); a
    realtime session's audio reference -> its memoised part (decoded by the pool on first use)."""
    kind = s.MEDIA_PART_KINDS[part.type]
    spec = ctx.info.patch_specs.get(kind)
    if isinstance(part, s.InputAudioPart):
        data, where = part.input_audio.data, f"{where}.input_audio.data"
        if ctx.audio_memo is not None and ctx.audio_memo.holds(data):
            return ctx.audio_memo.decode(data, where, ctx.pool, ticket)
        return ctx.pool.decode(kind, data, where, is_base64=True, ticket=ticket)
    ref = getattr(part, part.type)
    url = ref if isinstance(ref, str) else ref.url
    return ctx.pool.decode(kind, url, f"{where}.{part.type}", spec=spec, ticket=ticket)


def _text(content: str | list | None) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content or [])


def _assistant_message(m: s.AssistantMessage, where: str, store: AudioStore) -> dict:
    """An assistant turn: its text (its audio's transcript, for audio by id) and its tool calls."""
    if m.audio is not None:
        content = store.get(m.audio.id)
        if content is None:
            raise bad_request(f"{where}.audio.id: no audio with this id (unknown or expired)", f"{where}.audio.id")
    elif m.content is None and not m.tool_calls:
        raise bad_request(f"{where}: an assistant message needs content, audio or tool_calls", f"{where}.content")
    else:
        content = None if m.content is None else _text(m.content)
    if not m.tool_calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content, "tool_calls": [_plain(call) for call in m.tool_calls]}


def usage(output: dict) -> dict:
    prompt, completion = len(output["prompt_token_ids"]), len(output["token_ids"])
    details = {"cached_tokens": output["num_cached_tokens"], "audio_tokens": output["num_audio_prompt_tokens"]}
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }


def logprobs_block(output: dict) -> dict | None:
    """OpenAI ``logprobs.content`` from the engine's per-token logprobs (None when not asked)."""
    if not output.get("logprobs"):
        return None

    def entry(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for item in output["logprobs"]:
        top = [entry(t, lp) for t, lp in item["top"]]
        content.append({**entry(item["token"], item["logprob"]), "top_logprobs": top})
    return {"content": content}


def completion(output: dict, options: ChatOptions, store: AudioStore, sample_rate: int) -> dict:
    """The non-streaming response body."""
    content, tool_calls = output["text"], []
    if options.parses_tools:
        content, tool_calls = tool_responses.read_message(output["text"])
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if options.audio_format is not None:
        audio_id, transcript = f"audio_{uuid.uuid4().hex}", content or ""
        data = encode_audio(np.asarray(output["audio"], np.float32), options.audio_format, sample_rate)
        message["content"] = None  # the text is the audio's transcript (OpenAI's shape)
        message["audio"] = {
            "id": audio_id,
            "data": base64.b64encode(data).decode(),
            "expires_at": store.put(audio_id, transcript),
            "transcript": transcript,
        }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs_block(output),
        "finish_reason": tool_responses.finish_reason(output["finish_reason"], bool(tool_calls)),
    }
    return _envelope("chat.completion", options, choices=[choice], usage=usage(output))


def chunk(options: ChatOptions, delta: dict, finish_reason: str | None = None, logprobs=None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return _envelope("chat.completion.chunk", options, choices=[choice])


def audio_data_delta(audio_id: str, samples) -> dict:
    data = base64.b64encode(pcm16_bytes(np.asarray(samples, dtype=np.float32))).decode()
    return {"audio": {"id": audio_id, "data": data}}


def _envelope(kind: str, options: ChatOptions, **fields) -> dict:
    return {"id": options.id, "object": kind, "created": int(time.time()), "model": options.model, **fields}
