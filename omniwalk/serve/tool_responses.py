"""The answer of a chat request with tools, read as content and tool calls (OpenAI's shapes).

The model writes its calls into its text (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
``omniwalk.structured.tools`` reads them). Non-streamed, ``message.tool_calls`` holds them and
``message.content`` the text outside them (null when there is none); streamed, ``ToolDeltas`` turns
each text delta into content deltas and ``delta.tool_calls`` increments (a call's index, id, type
and name with empty arguments first, then its argument pieces), holding back only text that may
open a call and whitespace that may end the content: the streamed content concatenates to the
non-streamed one, which is stripped. A response with calls finishes with "tool_calls" where the engine says "stop". With
audio out the content is the transcript: the talker voices the text, never a call.

Requests without tools (or with tool_choice "none") never come here: their text is their content.
"""

from __future__ import annotations

from collections.abc import Callable

from omniwalk.structured.tools import (
    Arguments,
    CallStart,
    Content,
    ToolCallStream,
    delta_tool_calls,
    openai_tool_calls,
    parse_tool_calls,
)


def finish_reason(engine_reason: str, has_calls: bool) -> str:
    """ "tool_calls" for an answer that ends in calls; a call cut short by max_tokens stays "length"."""
    return "tool_calls" if has_calls and engine_reason == "stop" else engine_reason


def read_message(text: str) -> tuple[str | None, list[dict]]:
    """A whole answer -> (its content, its ``message.tool_calls``: [] when it calls nothing)."""
    content, calls = parse_tool_calls(text)
    return content, openai_tool_calls(calls)


class ToolDeltas:
    """One streamed answer's text deltas -> chat deltas: ``content_delta(text)`` for content (a
    ``content`` or an audio ``transcript`` delta) and ``{"tool_calls": [...]}`` for calls."""

    def __init__(self, content_delta: Callable[[str], dict]):
        self.stream = ToolCallStream()
        self.content_delta = content_delta
        self.held_space = ""  # whitespace after the content so far: sent only if more content follows
        self.is_content_started = False  # (whitespace before the content is never sent)

    @property
    def has_calls(self) -> bool:
        return bool(self.stream.calls)

    def feed(self, text: str) -> list[dict]:
        return self._deltas(self.stream.feed(text))

    def finish(self) -> list[dict]:
        """The text held back at the end (an unterminated call is content; trailing whitespace goes)."""
        return self._deltas(self.stream.finish())

    def _deltas(self, pieces: list) -> list[dict]:
        out = []
        for piece in pieces:
            if isinstance(piece, Content):
                out.extend(self._content(piece.text))
            elif isinstance(piece, CallStart | Arguments):
                out.append({"tool_calls": [delta_tool_calls(piece)]})
        return out

    def _content(self, text: str) -> list[dict]:
        text = self.held_space + text
        if not self.is_content_started:
            text = text.lstrip()
        sent = text.rstrip()
        self.held_space = text[len(sent) :]
        if not sent:
            return []
        self.is_content_started = True
        return [self.content_delta(sent)]
