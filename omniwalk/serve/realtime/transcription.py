"""Input audio transcription: the model itself writes down what a user item said.

When a session turns transcription on (GA ``audio.input.transcription``, beta
``input_audio_transcription``; any ``model`` name: the served model transcribes, it hears audio
natively), every committed audio item gets a text-only engine request beside the response: the
item's audio and ``PROMPT``, greedy. Its text streams as
``conversation.item.input_audio_transcription.delta`` events and ends with ``.completed``
(``.failed`` with the error otherwise); the item's content shows the transcript from then on.
The prompt of later turns still carries the audio itself, not this transcript. The item's audio is
decoded once for its transcription and the session's responses together (``conversation.AudioMemo``).
"""

from __future__ import annotations

import math

from omniwalk.serve.errors import APIError
from omniwalk.serve.realtime.conversation import Message
from omniwalk.serve.realtime.response import engine_request
from omniwalk.serve.realtime.vad import INPUT_RATE
from omniwalk.serve.wire import Finished

PROMPT = "Transcribe the audio exactly, in its language. Reply with the transcript only."
# a transcript's length bound: speech runs at ~3 words (~4 tokens) a second, so twice that, + a margin
MAX_TOKENS_PER_SECOND, MIN_MAX_TOKENS = 8, 16


async def transcribe(emit, run_engine, context, item: Message) -> None:
    """Emit the transcription events of ``item``'s audio (its first audio part)."""
    index = next(i for i, part in enumerate(item.parts) if part.kind == "audio")
    message = item.chat_message()
    message["content"] = [c for c in message["content"] if c["type"] == "input_audio"][:1]
    message["content"].append({"type": "text", "text": PROMPT})
    seconds = len(item.parts[index].audio) / INPUT_RATE
    max_tokens = MIN_MAX_TOKENS + math.ceil(MAX_TOKENS_PER_SECOND * seconds)
    body = {"messages": [message], "modalities": ["text"], "max_tokens": max_tokens, "temperature": 0.0}
    ids = {"item_id": item.id, "content_index": index}
    text = ""
    try:
        request, _ = await engine_request(body, context)
        run = run_engine(request)
        try:
            event = await run.first_event()
            while not isinstance(event, Finished):
                if event.kind == "text":
                    text += event.data
                    await emit("conversation.item.input_audio_transcription.delta", **ids, delta=event.data)
                event = await run.next_event()
        finally:
            await run.close()
    except APIError as e:
        error = {"type": e.kind, "code": e.code, "message": str(e)}
        await emit("conversation.item.input_audio_transcription.failed", **ids, error=error)
        return
    item.parts[index].text = text
    await emit("conversation.item.input_audio_transcription.completed", **ids, transcript=text)
