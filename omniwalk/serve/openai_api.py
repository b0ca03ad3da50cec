"""OpenAI chat-completions shapes: request body -> engine request, engine output -> response.

One choice per response; text in ``message.content`` / ``delta.content``; speech in
``message.audio`` ({id, data = the whole file in the requested format, expires_at, transcript}) or
``delta.audio`` ({id, data = base64 PCM16 24 kHz, transcript = the text since the last chunk}).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass

import numpy as np

from omniwalk.config import ServerConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.serve.audio_format import encode_audio, normalize_format, pcm16_bytes

# Body fields passed to the engine as they are (sampling, speech sampling, media options).
PASSTHROUGH = (
    "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "min_tokens", "ignore_eos",
    "logprobs", "top_logprobs", "talker_temperature", "talker_top_k", "talker_top_p",
    "talker_repetition_penalty", "code_predictor_temperature", "code_predictor_top_k", "code_predictor_top_p",
    "min_audio_frames", "max_audio_frames", "use_audio_in_video", "use_default_system_prompt",
)  # fmt: skip
AUDIO_EXPIRY_S = 3600


@dataclass(frozen=True)
class ChatOptions:
    """What shapes the response (not the generation)."""

    id: str
    model: str
    stream: bool
    include_usage: bool
    audio_format: str | None  # None: text only


def chat_request(body: dict, cfg: ServerConfig) -> tuple[dict, ChatOptions]:
    """Validate an OpenAI chat body -> (engine request, response options). Raises InvalidRequestError."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    model = body.get("model", cfg.served_model_name)
    if model != cfg.served_model_name:
        raise InvalidRequestError(f"unknown model {model!r}; this server serves {cfg.served_model_name!r}")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise InvalidRequestError("'messages' must be a non-empty list")
    if body.get("n", 1) != 1:
        raise InvalidRequestError("only n=1 is supported")
    modalities = body.get("modalities") or ["text"]
    request = {"messages": body["messages"], "modalities": modalities, "request_id": f"chatcmpl-{uuid.uuid4().hex}"}
    request.update({k: body[k] for k in PASSTHROUGH if body.get(k) is not None})
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or cfg.default_max_tokens
    _check_limit("max_tokens", max_tokens, cfg.max_tokens_limit)
    request["max_tokens"] = max_tokens
    _check_limit("max_audio_frames", request.get("max_audio_frames", 1), cfg.max_audio_frames_limit)
    audio_format = None
    if isinstance(modalities, list) and "audio" in modalities:
        audio = body.get("audio") or {}
        if not isinstance(audio, dict):
            raise InvalidRequestError("'audio' must be an object {voice, format}")
        try:
            audio_format = normalize_format(audio.get("format", "wav"))
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        request["voice"] = audio.get("voice")
        request.setdefault("max_audio_frames", cfg.max_audio_frames_limit)
    stream_options = body.get("stream_options") or {}
    options = ChatOptions(
        request["request_id"], model, bool(body.get("stream")), bool(stream_options.get("include_usage")), audio_format
    )
    return request, options


def _check_limit(name: str, value, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")
    if value > limit:
        raise InvalidRequestError(f"{name} = {value} exceeds this server's limit of {limit}")


def usage(output: dict) -> dict:
    prompt, completion = len(output["prompt_token_ids"]), len(output["token_ids"])
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def logprobs_block(output: dict, decode) -> dict | None:
    """OpenAI ``logprobs.content`` from the engine's per-token logprobs (None when not asked)."""
    if not output.get("logprobs"):
        return None

    def entry(token_id: int, logprob: float) -> dict:
        text = decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for item in output["logprobs"]:
        top = [entry(int(t), lp) for t, lp in item["top"]]
        content.append({**entry(item["token_id"], item["logprob"]), "top_logprobs": top})
    return {"content": content}


def completion(output: dict, options: ChatOptions, decode) -> dict:
    """The non-streaming response body."""
    message = {"role": "assistant", "content": output["text"]}
    if options.audio_format is not None:
        audio = np.asarray(output["audio"], dtype=np.float32)
        message["audio"] = {
            "id": f"audio-{uuid.uuid4().hex}",
            "data": base64.b64encode(encode_audio(audio, options.audio_format)).decode(),
            "expires_at": int(time.time()) + AUDIO_EXPIRY_S,
            "transcript": output["text"],
        }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs_block(output, decode),
        "finish_reason": output["finish_reason"],
    }
    return _envelope("chat.completion", options, choices=[choice], usage=usage(output))


def chunk(options: ChatOptions, delta: dict, finish_reason: str | None = None, logprobs=None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return _envelope("chat.completion.chunk", options, choices=[choice])


def audio_delta(audio_id: str, samples, transcript: str) -> dict:
    data = base64.b64encode(pcm16_bytes(np.asarray(samples, dtype=np.float32))).decode()
    return {"audio": {"id": audio_id, "data": data, "transcript": transcript}}


def _envelope(kind: str, options: ChatOptions, **fields) -> dict:
    return {"id": options.id, "object": kind, "created": int(time.time()), "model": options.model, **fields}
