"""How much a session's conversation may hold, and the audio all sessions hold together.

Per session (``ConversationLimits``: seconds of audio, bytes of items): an item that would take
the conversation past either bound drops the oldest items first, as OpenAI's default truncation
("auto") drops the oldest items when a conversation outgrows the context; the client gets a
``conversation.item.deleted`` event for each. An item larger than a bound on its own (or with
the items never dropped: the answer in progress, the item it is inserted after) is refused with
an ``error`` event (code ``conversation_item_too_large``).

Across sessions (``AudioBudget``): an item whose audio would take what all sessions hold past
the server's budget is refused with an ``error`` event (code ``server_audio_budget_exceeded``);
nothing is dropped then (another session's load is no reason to forget this one's past).
"""

from __future__ import annotations

from dataclasses import dataclass

from omniwalk.serve.errors import APIError
from omniwalk.serve.realtime.vad import INPUT_RATE

# an item's record (its dataclasses, ids and JSON) counts this many bytes beside its content, so
# that a flood of empty items is bounded too
ITEM_OVERHEAD_BYTES = 256


@dataclass(frozen=True)
class ConversationLimits:
    max_audio_bytes: int  # PCM16 of all items' audio (2 bytes a sample at 24 kHz)
    max_bytes: int  # audio + text (UTF-8) + ITEM_OVERHEAD_BYTES per item

    @classmethod
    def from_config(cls, cfg) -> ConversationLimits:
        return cls(int(cfg.realtime_max_conversation_audio_s * INPUT_RATE) * 2, cfg.realtime_max_conversation_bytes)


@dataclass(frozen=True)
class Size:
    audio_bytes: int
    num_bytes: int  # audio included


def item_size(item) -> Size:
    """An item's size (any item of ``conversation.py``: they count their audio and text bytes)."""
    return Size(item.num_audio_bytes, item.num_audio_bytes + item.num_text_bytes + ITEM_OVERHEAD_BYTES)


def audio_size(num_samples: int) -> Size:
    """The size of a user item holding ``num_samples`` of PCM16 (a commit's, before it is made)."""
    return Size(2 * num_samples, 2 * num_samples + ITEM_OVERHEAD_BYTES)


class AudioBudget:
    """The conversation audio all sessions hold (bytes of PCM16), against one budget."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.num_held = max_bytes, 0

    def check(self, num_bytes: int, num_freed: int) -> None:
        """Raise the error that refuses holding ``num_bytes`` more once ``num_freed`` are given back."""
        if self.num_held - num_freed + num_bytes > self.max_bytes:
            raise APIError(
                400,
                f"the server holds {self.num_held} bytes of conversation audio of its budget of {self.max_bytes}; "
                "delete items or retry later",
                code="server_audio_budget_exceeded",
            )

    def hold(self, num_bytes: int) -> None:
        self.num_held += num_bytes

    def release(self, num_bytes: int) -> None:
        self.num_held -= num_bytes


def oldest_to_drop(items: list, new: Size, limits: ConversationLimits, keep: set[str]) -> list:
    """The oldest items (none of ``keep``) whose removal makes room for an item of size ``new``;
    raises an APIError when no removal does (the item alone, or with the kept ones, is past a bound)."""
    kept = [item_size(item) for item in items if item.id in keep]
    _check_fits(new.audio_bytes + sum(s.audio_bytes for s in kept), limits.max_audio_bytes, "bytes of audio")
    _check_fits(new.num_bytes + sum(s.num_bytes for s in kept), limits.max_bytes, "bytes")
    sizes = [(item, item_size(item)) for item in items]
    audio = sum(s.audio_bytes for _, s in sizes) + new.audio_bytes
    total = sum(s.num_bytes for _, s in sizes) + new.num_bytes
    dropped = []
    for item, size in sizes:
        if audio <= limits.max_audio_bytes and total <= limits.max_bytes:
            break
        if item.id not in keep:
            dropped.append(item)
            audio, total = audio - size.audio_bytes, total - size.num_bytes
    return dropped


def _check_fits(num_held: int, limit: int, what: str) -> None:
    if num_held > limit:
        raise APIError(
            400,
            f"the item (with the items kept: the answer in progress, its predecessor) holds {num_held} {what}; "
            f"a conversation holds at most {limit}",
            param="item",
            code="conversation_item_too_large",
        )
