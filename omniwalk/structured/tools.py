"""The model's tool calls read back out of its text, whole (``parse_tool_calls``) or as it streams
(``ToolCallStream``).

The format is Hermes-style, as Qwen's templates teach it: optional text, then calls, each

    <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>

possibly several (usually one per line) and possibly text after them. Around the JSON, whitespace is
free. A call is ``<tool_call>``, whitespace, one strict JSON object (RFC 8259: no NaN, no control
characters in strings) with exactly one ``"name"`` key whose value is a non-empty string and at most one
``"arguments"`` key, whitespace, ``</tool_call>``. ``ToolCall.arguments`` is the source text of the
``"arguments"`` value exactly as the model wrote it (any JSON value; ``"{}"`` when the key is absent);
other keys are ignored. Anything else is not a call: its ``<tool_call>`` is content and the text after
it is read again, so a well-formed call later on is still found. Nothing here raises on model output.

Guarantees, for any text and any split of it into ``feed`` pieces (``parse_tool_calls`` is one feed):
- the ``Content`` texts concatenate to the text outside the calls; ``parse_tool_calls`` returns that
  concatenation stripped (``None`` when empty);
- ``calls`` are the same, in order, with the same names and arguments (ids are drawn per stream);
- the ``Arguments`` texts of a call concatenate to its ``arguments``.
Content is held back only while it ends with a proper prefix of ``<tool_call>``. Inside a call,
``CallStart`` comes once the name is read and ``Arguments`` stream the value's text as it arrives (only
characters that are certainly part of it). A call found malformed after its ``CallStart`` (bad JSON
later, or cut off by the end of the text) is dropped: its raw text comes as content, it is absent from
``calls`` and its index is not reused. Match ``CallStart`` to ``calls`` by ``id``; for well-formed
output the indices are 0, 1, ... in the order of ``calls``.
"""

import json
import re
import secrets
from dataclasses import dataclass, field

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    id: str  # "call_" + 24 hex characters
    name: str
    arguments: str  # the JSON text of the "arguments" value as written


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Piece = Content | CallStart | Arguments

_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_CLOSER = {"{": "}", "[": "]"}


@dataclass
class _Member:
    """One key of the call's object; spans index ``_CallScanner.text``."""

    key_start: int
    key: str | None = None  # decoded once its string closes
    start: int | None = None  # the value's first character
    end: int | None = None  # just past the value's last character


@dataclass
class _CallScanner:
    """Reads the text after ``<tool_call>`` one character at a time: whitespace, a strict JSON object,
    whitespace, ``</tool_call>``; it records the spans of the object's members. ``failed`` as soon as no
    continuation can make it a call; ``end`` (just past ``</tool_call>``) once it is one."""

    text: str = ""
    pos: int = 0  # characters of text read
    members: list[_Member] = field(default_factory=list)
    failed: bool = False
    end: int | None = None
    _stack: list[str] = field(default_factory=list)  # open "{" / "["
    # object (before the root "{"), first_key / key, colon, first_value / value, next (after a value),
    # close (matching </tool_call>)
    _expect: str = "object"
    _scalar: str = ""  # inside a token: "key", "string", "number", "literal"
    _token: str = ""  # a number's or literal's text so far; a string's unfinished escape
    _num_closed: int = 0  # characters of </tool_call> matched

    def feed(self, text: str) -> None:
        self.text += text
        while self.pos < len(self.text) and not self.failed and self.end is None:
            if self._step(self.text[self.pos]):
                self.pos += 1
            else:
                self.failed = True

    def member(self, key: str) -> _Member | None:
        return next((m for m in self.members if m.key == key), None)

    def _step(self, c: str) -> bool:
        if self._scalar in ("key", "string"):
            return self._string_step(c)
        if self._scalar:  # a number or literal ends at the first character that cannot extend it
            if self._extends(self._token + c):
                self._token += c
                return True
            if not (_NUMBER.fullmatch(self._token) if self._scalar == "number" else self._token in _LITERALS):
                return False
            self._scalar = self._token = ""
            self._value_done(self.pos)
        if self._expect == "close":
            return self._close_step(c)
        if c in _WS:
            return True
        return self._structure_step(c)

    def _extends(self, token: str) -> bool:
        if self._scalar == "number":
            return token[-1] in _NUMBER_CHARS
        return any(literal.startswith(token) for literal in _LITERALS)

    def _string_step(self, c: str) -> bool:
        if self._token:  # inside an escape: "\" or "\u" plus the hex digits so far
            if self._token == "\\":
                self._token = "\\u" if c == "u" else ""
                return c in _ESCAPES
            self._token = "" if len(self._token) == 5 else self._token + c
            return c in _HEX
        if c == "\\":
            self._token = "\\"
        elif c == '"':
            if self._scalar == "string":
                self._value_done(self.pos + 1)
            else:
                if len(self._stack) == 1:
                    member = self.members[-1]
                    member.key = json.loads(self.text[member.key_start : self.pos + 1])
                self._expect = "colon"
            self._scalar = ""
        return c >= " "

    def _structure_step(self, c: str) -> bool:
        expect = self._expect
        if expect == "object":
            return c == "{" and self._push(c)
        if expect in ("first_key", "key"):
            if expect == "first_key" and c == "}":
                return self._pop()
            if c != '"':
                return False
            if len(self._stack) == 1:
                self.members.append(_Member(key_start=self.pos))
            self._scalar = "key"
            return True
        if expect == "colon":
            self._expect = "value"
            return c == ":"
        if expect in ("first_value", "value"):
            if expect == "first_value" and c == "]":
                return self._pop()
            if len(self._stack) == 1:
                self.members[-1].start = self.pos
            if c in "{[":
                return self._push(c)
            self._scalar = "string" if c == '"' else "number" if c in "-0123456789" else "literal"
            self._token = "" if c == '"' else c
            return c == '"' or c in "-0123456789" or c in "tfn"
        if c == ",":  # expect == "next"
            self._expect = "key" if self._stack[-1] == "{" else "value"
            return True
        return c == _CLOSER[self._stack[-1]] and self._pop()

    def _push(self, c: str) -> bool:
        self._stack.append(c)
        self._expect = "first_key" if c == "{" else "first_value"
        return True

    def _pop(self) -> bool:
        self._stack.pop()
        if self._stack:
            self._value_done(self.pos + 1)
        else:
            self._expect = "close"
        return True

    def _value_done(self, end: int) -> None:
        if len(self._stack) == 1:
            self.members[-1].end = end
        self._expect = "next"

    def _close_step(self, c: str) -> bool:
        if self._num_closed == 0 and c in _WS:
            return True
        if c != TOOL_CALL_END[self._num_closed]:
            return False
        self._num_closed += 1
        if self._num_closed == len(TOOL_CALL_END):
            self.end = self.pos + 1
        return True


def _name(scanner: _CallScanner) -> str | None:
    """The call's name once its string is read: a non-empty string value of the first "name" key."""
    member = scanner.member("name")
    if member is None or member.end is None or scanner.text[member.start] != '"':
        return None
    return json.loads(scanner.text[member.start : member.end]) or None


def _arguments(scanner: _CallScanner, skip: int = 0) -> str:
    """The "arguments" value's text read so far ("{}" for a finished call without one), less its first
    ``skip`` characters."""
    member = scanner.member("arguments")
    if member is None or member.start is None:
        return ("{}" if scanner.end is not None else "")[skip:]
    return scanner.text[member.start + skip : scanner.pos if member.end is None else member.end]


def _is_call(scanner: _CallScanner) -> bool:
    keys = [m.key for m in scanner.members]
    return keys.count("name") == 1 and keys.count("arguments") <= 1 and _name(scanner) is not None


class ToolCallStream:
    """Splits one response's text, fed as it is decoded, into content and tool-call pieces (see the
    module's guarantees). ``finish()`` once at the end: it flushes held content and drops an unfinished
    call."""

    def __init__(self):
        self._held = ""  # content ending in a proper prefix of <tool_call>
        self._call: _CallScanner | None = None
        self._start: CallStart | None = None  # the open call's, once its name is read
        self._num_sent = 0  # characters of the open call's arguments sent
        self._num_started = 0
        self._calls: list[ToolCall] = []

    @property
    def calls(self) -> list[ToolCall]:
        """The calls completed so far, in order."""
        return list(self._calls)

    def feed(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        self._read(text, pieces)
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        while self._call is not None:  # unterminated: reading its text again may open another call
            self._read(self._drop(pieces), pieces)
        _add_content(pieces, self._held)
        self._held = ""
        return pieces

    def _read(self, text: str, pieces: list[Piece]) -> None:
        while text:
            text = self._read_content(text, pieces) if self._call is None else self._read_call(text, pieces)

    def _read_content(self, text: str, pieces: list[Piece]) -> str:
        text, self._held = self._held + text, ""
        start = text.find(TOOL_CALL_START)
        if start >= 0:
            _add_content(pieces, text[:start])
            self._call = _CallScanner()
            return text[start + len(TOOL_CALL_START) :]
        num_held = next((n for n in range(len(TOOL_CALL_START) - 1, 0, -1) if text.endswith(TOOL_CALL_START[:n])), 0)
        _add_content(pieces, text[: len(text) - num_held])
        self._held = text[len(text) - num_held :]
        return ""

    def _read_call(self, text: str, pieces: list[Piece]) -> str:
        """Feeds the open call; returns the text left to read as content."""
        call = self._call
        call.feed(text)
        if call.failed or (call.end is not None and not _is_call(call)):
            return self._drop(pieces)
        if self._start is None and (name := _name(call)) is not None:
            self._start = CallStart(index=self._num_started, id="call_" + secrets.token_hex(12), name=name)
            self._num_started += 1
            pieces.append(self._start)
        if self._start is not None:
            if arguments := _arguments(call, skip=self._num_sent):
                pieces.append(Arguments(index=self._start.index, text=arguments))
                self._num_sent += len(arguments)
        if call.end is None:
            return ""
        self._calls.append(ToolCall(id=self._start.id, name=self._start.name, arguments=_arguments(call)))
        self._close()
        return call.text[call.end :]

    def _drop(self, pieces: list[Piece]) -> str:
        """Ends the open call as not a call: its tag is content; returns its text, to be read again."""
        text = self._call.text
        self._close()
        _add_content(pieces, TOOL_CALL_START)
        return text

    def _close(self) -> None:
        self._call, self._start, self._num_sent = None, None, 0


def _add_content(pieces: list[Piece], text: str) -> None:
    if text:
        pieces.append(Content(text))


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole response's content (the text outside its calls, stripped; None if empty) and calls."""
    stream = ToolCallStream()
    pieces = stream.feed(text) + stream.finish()
    content = "".join(piece.text for piece in pieces if isinstance(piece, Content)).strip()
    return content or None, stream.calls


def openai_tool_calls(calls: list[ToolCall]) -> list[dict]:
    """``message.tool_calls`` of a chat completion."""
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in calls
    ]


def delta_tool_calls(piece: CallStart | Arguments) -> dict:
    """One entry of a streamed chunk's ``delta.tool_calls``: a call's start (id, type, name) or a piece of
    its arguments; a client appends ``function.arguments`` by ``index``."""
    if isinstance(piece, CallStart):
        return {
            "index": piece.index,
            "id": piece.id,
            "type": "function",
            "function": {"name": piece.name, "arguments": ""},
        }
    if isinstance(piece, Arguments):
        return {"index": piece.index, "function": {"arguments": piece.text}}
    raise TypeError(f"no tool-call delta for {type(piece).__name__}")
