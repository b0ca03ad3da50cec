"""``POST /v1/audio/speech``: speak exactly the given text.

The text is given to the thinker as its answer (``forced_answer``): the thinker runs the prefill
of a short prompt (its hidden states make the talker's prefix) and, instead of sampling, commits
the text's tokens and the end of the turn at once, with no decode steps; the talker voices those
tokens and the request ends when the speech does. ``speed`` other than 1.0, ``instructions``,
``stream_format: "sse"`` and ``aac`` are refused with a 400 that says so.
"""

from __future__ import annotations

import uuid

from omniwalk.serve import openai_api as api
from omniwalk.serve.audio_format import normalize_format
from omniwalk.serve.errors import APIError, bad_request, unsupported
from omniwalk.serve.schemas import SpeechRequest

SPEECH_SYSTEM_PROMPT = "Read the user's text aloud, exactly as written."
SPEECH_PASSTHROUGH = (
    "seed", "talker_temperature", "talker_top_k", "talker_top_p", "talker_repetition_penalty",
    "code_predictor_temperature", "code_predictor_top_k", "code_predictor_top_p", "min_audio_frames",
)  # fmt: skip


def speech_request(body: SpeechRequest, ctx: api.Context) -> tuple[dict, str]:
    """A validated speech body -> (engine request, response audio format)."""
    api.check_model(body.model, ctx.cfg)
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
        **{k: getattr(body, k) for k in SPEECH_PASSTHROUGH if getattr(body, k) is not None},
        **api.check_speech(body, ctx, body.voice, "voice"),
    }
    if request.get("min_audio_frames", 0) > request["max_audio_frames"]:
        raise bad_request("min_audio_frames must not exceed max_audio_frames", "min_audio_frames")
    return request, normalize_format(body.response_format)
