"""Chat messages -> thinker prompt: ids with expanded placeholder runs, media spans, MRoPE positions.

Three steps, each equal to what HF's chat template + the family's HF processor do:

1. ``normalize_messages``: OpenAI-style messages -> messages whose parts are canonical
   (``text`` / ``audio`` / ``image`` / ``video``), plus the media payloads in content order.
   Assistant ``tool_calls`` and ``tool`` results pass through in OpenAI's shape (the template
   lays them out). A default system prompt is prepended unless the conversation starts with its own.
2. ``render_chat``: the checkpoint's Jinja chat template (HF's rendering settings), given the
   request's ``tools`` as HF's ``apply_chat_template(messages, tools=...)`` passes them -> text,
   tokenised. Every media part renders as ONE placeholder token between its sentinels.
3. ``expand_placeholders``: each placeholder becomes its encoder's token count; with
   ``use_audio_in_video`` a video that carries an audio track becomes
   ``<|audio_start|>`` + video/audio pads interleaved by time + ``<|audio_end|>``.
   Because special tokens are atomic for the tokenizer, expanding ids equals tokenising the
   expanded text.

Token counts are not computed here: each ``MediaItem`` arrives measured by the media
preprocessing (audio tokens from the audio encoder's length formula, grid_thw from the resize).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from omniwalk.errors import CheckpointError, InvalidRequestError
from omniwalk.media.preprocess import DIGEST
from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.positions import (
    AUDIO,
    AUDIO_IN_VIDEO,
    IMAGE,
    VIDEO,
    MediaSpan,
    RopePositions,
    interleave_audio_video,
    mrope_positions,
    video_times,
)
from omniwalk.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
# content part type -> canonical media kind; "text" stays text
PART_KINDS = {
    "audio": AUDIO,
    "input_audio": AUDIO,
    "audio_url": AUDIO,
    "image": IMAGE,
    "image_url": IMAGE,
    "video": VIDEO,
    "video_url": VIDEO,
}


@dataclass
class MediaPart:
    """One media content part as the user sent it (array, base64 payload or data URL)."""

    kind: str  # AUDIO / IMAGE / VIDEO
    part: dict  # the original content part

    @property
    def digest(self) -> bytes | None:
        """The HTTP process's digest of an array part's content (``media.preprocess``; bytes, which no
        client's JSON can make), or None."""
        digest = self.part.get(DIGEST)
        return digest if isinstance(digest, bytes) else None


@dataclass
class MediaItem:
    """A measured media input, ready for its encoder.

    ``grid_thw`` is in patches (before the 2x2 merge); ``num_audio_tokens`` is the audio
    encoder's output length (for a video: its audio track's, or 0 when it has none).
    ``data`` is the preprocessed encoder input, opaque to the processor.
    """

    kind: str
    num_audio_tokens: int = 0
    grid_thw: tuple[int, int, int] = (0, 0, 0)
    seconds_per_grid: float = 0.0
    data: Any = None
    # its part's content digest where the HTTP process made one (``MediaPart.digest``: the same arrays measure
    # to the same item), and the item's digest, made once when a prefix key first names it (``item_digest``)
    source_digest: bytes | None = field(default=None, repr=False, compare=False)
    digest: bytes | None = field(default=None, repr=False, compare=False)


def measure_parts(parts: list[MediaPart], measure: Callable[[MediaPart], MediaItem]) -> list[MediaItem]:
    """Each part measured by the family's ``measure``, with its part's content digest (``MediaPart.digest``)."""
    items = [measure(part) for part in parts]
    for item, part in zip(items, parts, strict=True):
        item.source_digest = part.digest
    return items


@dataclass
class Prompt:
    token_ids: list[int]
    spans: list[MediaSpan] = field(default_factory=list)  # prompt order
    items: list[MediaItem] = field(default_factory=list)  # items[i] fills spans[i]
    rope: RopePositions | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)


class ChatProcessor:
    """The three steps bound to one checkpoint's tokenizer, template and token ids. ``cfg``: a
    family's config with ``tokens``, ``vision.spatial_merge_size``, ``position_id_per_seconds``."""

    def __init__(self, cfg, tokenizer: Tokenizer, default_system_prompt: str | None):
        if not tokenizer.chat_template:
            raise CheckpointError(
                "the checkpoint has no chat template (chat_template.jinja, chat_template.json or "
                "tokenizer_config.json's chat_template)"
            )
        self.cfg, self.tokenizer, self.default_system_prompt = cfg, tokenizer, default_system_prompt

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders ``tools`` (a template that never reads the variable
        would drop them silently)."""
        return "tools" in template_variables(self.tokenizer.chat_template)

    def tokenize(
        self, messages: list[dict], use_default_system_prompt: bool = True, tools: list[dict] | None = None
    ) -> tuple[list[int], list[MediaPart]]:
        """Messages (+ the request's OpenAI ``tools``, validated by the caller) -> (ids with one
        placeholder per media part, media parts in content order)."""
        if tools and not self.supports_tools:
            raise InvalidRequestError("this model's chat template does not support tools", param="tools")
        system = self.default_system_prompt if use_default_system_prompt else None
        messages, media = normalize_messages(messages, system)
        return self.tokenizer.encode(render_chat(self.tokenizer.chat_template, messages, tools=tools)), media

    def build(self, ids: list[int], items: list[MediaItem], use_audio_in_video: bool = False) -> Prompt:
        c = self.cfg
        return build_prompt(
            ids, items, c.tokens, c.vision.spatial_merge_size, use_audio_in_video, c.position_id_per_seconds
        )


def normalize_messages(messages: list[dict], system_prompt: str | None) -> tuple[list[dict], list[MediaPart]]:
    """Validate OpenAI-style messages -> (template-ready messages, media parts in content order)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    out, media = [], []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidRequestError(f"{where}.role must be one of {ROLES}")
        if message["role"] == "tool":
            out.append(_tool_result(message, where))
            continue
        content = message.get("content")
        if content is None or isinstance(content, str):
            out.append({"role": message["role"], "content": content or ""})
        elif isinstance(content, list):
            parts = [_canonical_part(p, f"{where}.content[{j}]", media) for j, p in enumerate(content)]
            out.append({"role": message["role"], "content": parts})
        else:
            raise InvalidRequestError(f"{where}.content must be a string or a list of content parts")
        if message.get("tool_calls") is not None:
            if message["role"] != "assistant":
                raise _invalid(f"{where}.tool_calls", "is only allowed on assistant messages")
            out[-1]["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
    if system_prompt and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": system_prompt})
    return out, media


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant's OpenAI ``tool_calls`` -> the same shape, checked (arguments: the JSON text)."""
    if not isinstance(calls, list):
        raise _invalid(where, "must be a list of tool calls")
    out = []
    for i, call in enumerate(calls):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            raise _invalid(at, "must be an object")
        if not isinstance(call.get("id"), str):
            raise _invalid(f"{at}.id", "must be a string")
        if call.get("type", "function") != "function":
            raise _invalid(f"{at}.type", "must be 'function'")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _invalid(f"{at}.function", "must be an object with name and arguments")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{at}.function.name", "must be a non-empty string")
        if not isinstance(arguments, str):
            raise _invalid(f"{at}.function.arguments", "must be a string (the arguments' JSON)")
        out.append({"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _tool_result(message: dict, where: str) -> dict:
    """A ``tool`` message: the result (a string) of the call ``tool_call_id`` names."""
    if not isinstance(message.get("tool_call_id"), str):
        raise _invalid(f"{where}.tool_call_id", "must be a string")
    if not isinstance(message.get("content"), str):
        raise _invalid(f"{where}.content", "must be a string (the tool's result)")
    return {"role": "tool", "tool_call_id": message["tool_call_id"], "content": message["content"]}


def _invalid(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


def _canonical_part(part: Any, where: str, media: list[MediaPart]) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{where}.text must be a string")
        return {"type": "text", "text": part["text"]}
    if kind not in PART_KINDS:
        known = ", ".join(["text", *PART_KINDS])
        raise InvalidRequestError(f"{where}: unknown content type {kind!r} (supported: {known})")
    media.append(MediaPart(PART_KINDS[kind], part))
    return {"type": PART_KINDS[kind]}


def render_chat(
    template: str, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
) -> str:
    """Render the checkpoint's chat template as HF's ``apply_chat_template(messages, tools=tools)``
    does (``tools``: OpenAI's ``[{"type": "function", "function": {...}}]``, passed as they are)."""
    return _compiled(template).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


@cache
def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads from its caller (``messages``, ``tools``, ...)."""
    from jinja2 import meta

    compiled = _compiled(template)
    return frozenset(meta.find_undeclared_variables(compiled.environment.parse(template)))


@cache
def _compiled(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InvalidRequestError(f"chat template: {message}")

    # HF's settings: trim/lstrip blocks, loop controls, ``raise_exception``, non-ASCII ``tojson``.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent, **kw)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise InvalidRequestError(f"the checkpoint's chat template does not compile: {e}") from None


def expand_placeholders(
    ids: list[int],
    items: list[MediaItem],
    tokens: TokenIds,
    merge_size: int,
    use_audio_in_video: bool,
    position_id_per_seconds: float,
    audio_video_order=None,
) -> tuple[list[int], list[MediaSpan]]:
    """Replace each single placeholder id by its run; ``items`` are in content order.
    ``audio_video_order(grid, seconds_per_grid, num_audio, position_id_per_seconds)``: an
    audio-in-video span's token order (True = video) (default: ``interleave_audio_video``)."""
    pads = {tokens.audio_pad: AUDIO, tokens.image_pad: IMAGE, tokens.video_pad: VIDEO}
    found = [pads[t] for t in ids if t in pads]
    if found != [item.kind for item in items]:
        raise InvalidRequestError(
            f"placeholder/media mismatch: the rendered prompt has placeholders {found} but the request "
            f"carries media {[item.kind for item in items]}"
        )
    out, spans, queue = [], [], iter(items)
    for i, t in enumerate(ids):
        if t not in pads:
            out.append(t)
            continue
        item = next(queue)
        _check_sentinels(ids, i, item.kind, tokens)
        span, run = _expand(
            item, len(out) - 1, tokens, merge_size, use_audio_in_video, position_id_per_seconds, audio_video_order
        )
        spans.append(span)
        out += run
    return out, spans


def _check_sentinels(ids: list[int], i: int, kind: str, t: TokenIds) -> None:
    start, end = (t.audio_start, t.audio_end) if kind == AUDIO else (t.vision_start, t.vision_end)
    if not (0 < i < len(ids) - 1 and ids[i - 1] == start and ids[i + 1] == end):
        raise InvalidRequestError(f"the chat template must wrap each {kind} placeholder in its start/end tokens")


def _time_order(grid, seconds_per_grid: float, num_audio: int, pos_per_s: float) -> list[bool]:
    return interleave_audio_video(video_times(grid, seconds_per_grid, pos_per_s), num_audio)


def _expand(
    item: MediaItem,
    start: int,
    t: TokenIds,
    merge: int,
    use_audio_in_video: bool,
    pos_per_s: float,
    audio_video_order=None,
):
    """-> (span, ids replacing the single placeholder)."""
    gt, gh, gw = item.grid_thw
    grid = (gt, gh // merge, gw // merge)
    if item.kind == AUDIO:
        return MediaSpan(AUDIO, start, num_audio=item.num_audio_tokens), [t.audio_pad] * item.num_audio_tokens
    if item.kind == IMAGE:
        return MediaSpan(IMAGE, start, grid=grid), [t.image_pad] * (grid[0] * grid[1] * grid[2])
    if not (use_audio_in_video and item.num_audio_tokens):
        span = MediaSpan(VIDEO, start, grid=grid, seconds_per_grid=item.seconds_per_grid)
        return span, [t.video_pad] * span.num_video
    span = MediaSpan(AUDIO_IN_VIDEO, start, item.num_audio_tokens, grid, item.seconds_per_grid)
    order = (audio_video_order or _time_order)(grid, item.seconds_per_grid, item.num_audio_tokens, pos_per_s)
    return span, [t.audio_start, *(t.video_pad if v else t.audio_pad for v in order), t.audio_end]


def build_prompt(
    ids: list[int],
    items: list[MediaItem],
    tokens: TokenIds,
    merge_size: int,
    use_audio_in_video: bool,
    position_id_per_seconds: float,
) -> Prompt:
    """Rendered + tokenised ids and measured media -> the full ``Prompt`` with MRoPE positions."""
    ids, spans = expand_placeholders(ids, items, tokens, merge_size, use_audio_in_video, position_id_per_seconds)
    rope = mrope_positions(len(ids), spans, position_id_per_seconds)
    return Prompt(ids, spans, list(items), rope)
