"""``POST /v1/audio/speech``: speak exactly the given text.

The text is given to the model as its answer (``forced_answer``, ``models/family.py``): the model
reads a short prompt and, instead of sampling, takes the text as what it says, and speaks it; the
request ends when the speech does. A model without audio output answers 400. ``speed`` other than 1.0, ``instructions``,
``stream_format: "sse"`` and ``aac`` are refused with a 400 that says so.
"""

from __future__ import annotations

import uuid

from omniwalk.serve import openai_api as api
from omniwalk.serve.audio_format import normalize_format
from omniwalk.serve.errors import APIError, bad_request, unsupported
from omniwalk.serve.schemas import SpeechRequest

SPEECH_SYSTEM_PROMPT = "Read the user's text aloud, exactly as written."


def speech_request(body: SpeechRequest, ctx: api.Context) -> tuple[dict, str]:
    """A validated speech body -> (engine request, response audio format)."""
    api.check_model(body.model, ctx)
    if body.speed != 1.0:
        raise APIError(400, "speed other than 1.0 is not supported", param="speed", code="unsupported_value")
    if body.instructions:
        raise unsupported("instructions", "instructions (voice direction)")
    if body.stream_format == "sse":
        raise unsupported("stream_format", "stream_format 'sse'")
    if body.response_format == "aac":
        raise bad_request("response_format 'aac' is not supported; use mp3, opus, flac, wav or pcm", "response_format")
    request = {
        "request_id": f"speech-{uuid.uuid4().hex}",
        "messages": [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": body.input}],
        "modalities": ["text", "audio"],
        "forced_answer": body.input,
        **{k: getattr(body, k) for k in ("seed", *ctx.info.speech_fields) if getattr(body, k) is not None},
        **api.check_speech(body, ctx, body.voice, "voice", "model"),
    }
    if request.get("min_audio_frames", 0) > request.get("max_audio_frames", 2**31):
        raise bad_request("min_audio_frames must not exceed max_audio_frames", "min_audio_frames")
    return request, normalize_format(body.response_format)
