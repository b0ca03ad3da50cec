"""A response's request: the session's settings, the response's own fields and the conversation as
the chat-completions body ``engine_request`` checks and turns into the engine's (``response.py``).

The body is all a response's answer depends on: a preemptive answer is kept only when the body of
the confirmed turn equals the one it was started with (``preemption.py``).
"""

from __future__ import annotations

from omniwalk.config import ServerConfig
from omniwalk.serve import openai_api as api
from omniwalk.serve.errors import bad_request
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.bounds import item_size
from omniwalk.serve.realtime.conversation import Conversation, Item
from omniwalk.serve.realtime.settings import (
    SAMPLING,
    Settings,
    check_output_format,
    check_response_refused,
    output_max_tokens,
    output_speaks,
    output_voice,
)
from omniwalk.serve.realtime.tools import chat_tool_choice, chat_tools, check_tools


def response_body(
    settings: Settings,
    context: api.Context,
    conversation: Conversation,
    cfg: ServerConfig,
    fields: p.ResponseFields,
    pending: Item | None = None,
) -> tuple[dict, bool]:
    """The chat-completions body of a response (and whether it speaks); ``pending``: a user item
    not yet in the conversation, as the last one (a turn being prepared)."""
    given = fields.model_fields_set
    check_response_refused(fields, "response")
    speaks = output_speaks(fields, "response")
    speaks = settings.speaks if speaks is None else speaks
    check_output_format(fields, "response")
    voice = output_voice(fields, context, "response") or settings.voice
    max_tokens = output_max_tokens(fields)
    max_tokens = settings.max_output_tokens if max_tokens is ... else max_tokens
    instructions = fields.instructions if "instructions" in given else settings.instructions
    check_prompt_size(conversation, cfg.max_body_bytes)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += conversation.chat_messages() + ([pending.chat_message()] if pending else [])
    if not any(m["role"] == "user" for m in messages):
        raise bad_request("the conversation has no user item to respond to", None, "conversation_empty")
    body = {
        "model": settings.model,  # (the served model's name, or the LoRA adapter the handshake named)
        "messages": messages,
        "modalities": ["text", "audio"] if speaks else ["text"],
        "stream": True,
        **({"audio": {"voice": voice, "format": "pcm16"}} if speaks else {}),
        **({"max_tokens": max_tokens} if max_tokens else {}),
        **settings.sampling,
        **{k: getattr(fields, k) for k in SAMPLING if k in given},
        **(fields.model_extra or {}),  # the family's own fields
    }
    body.update(_tools(settings, fields))
    return body, speaks


def _tools(settings: Settings, fields: p.ResponseFields) -> dict:
    """The response's ``tools`` and ``tool_choice`` in chat's shape (the response's own, else the
    session's); none when there are no tools."""
    given = fields.model_fields_set
    tools = list(fields.tools or []) if "tools" in given else settings.tools
    choice = (fields.tool_choice or "auto") if "tool_choice" in given else settings.tool_choice
    check_tools(tools, choice, "response")
    return {"tools": chat_tools(tools), "tool_choice": chat_tool_choice(choice)} if tools else {}


def check_prompt_size(conversation: Conversation, max_body_bytes: int) -> None:
    """Refuse a prompt the chat route would refuse as a body (its audio as base64 WAV), before
    building it. The body itself carries audio references (``conversation.AudioMemo``), but a
    conversation is bounded as the same chat sent over HTTP would be."""
    num_bytes = sum(item_size(item).num_bytes for item in conversation.items)
    estimate = num_bytes + conversation.num_audio_bytes // 3  # base64: 4 bytes per 3
    if estimate > max_body_bytes:
        raise bad_request(
            f"the conversation's prompt would be ~{estimate} bytes, past the server's {max_body_bytes}; "
            "delete items first",
            None,
            "conversation_too_large",
        )
