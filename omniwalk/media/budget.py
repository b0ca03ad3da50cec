"""Decoded-size budgets and cancellation for one request's media work.

Every decoder computes what an item will decode to from its container's header, before decoding,
and refuses more than its kind's budget (``MediaLimits.max_{audio,image,video}_decoded_bytes``):

    audio   samples x channels x 4 (float32 at the source rate; decoded as a stream, so this bounds
            decoding work, while memory stays at the 16 kHz mono output)
    image   width x height x 3 (Pillow decodes an image whole, then it is resized)
    video   sampled frames x height x width x 3 at the family's resize (frames are resized one by
            one as they are decoded; without a ``PatchSpec``, at their decoded size)

A ``DecodeTicket`` is shared by the worker threads decoding one request's items: it sums their
budgets against ``max_request_decoded_bytes`` and carries the request's cancel flag, which the
decode loops check per frame or chunk (``DecodeCancelled``: the client is gone).
"""

from __future__ import annotations

import threading

from omniwalk.media.errors import DecodeCancelled, MediaLimitError
from omniwalk.media.limits import MediaLimits

AUDIO_BYTES_PER_SAMPLE = 4  # a decoded audio sample per channel: float32 at the source rate (see above)


def check_decoded_size(num_bytes: int, limits: MediaLimits, kind: str) -> None:
    """Raise if one ``kind`` item ("audio", "image", "video") would decode to more than its budget."""
    name = f"max_{kind}_decoded_bytes"
    limit = getattr(limits, name)
    if num_bytes > limit:
        raise MediaLimitError(f"{kind} would decode to {num_bytes} bytes; the limit is {name} = {limit}")


class DecodeTicket:
    """One request's media work: its decoded bytes so far and whether its client is gone."""

    def __init__(self, max_request_bytes: int):
        self.max_request_bytes = max_request_bytes
        self.num_reserved_bytes = 0
        self._lock = threading.Lock()  # items of one request decode in several threads
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Called per decoded frame or chunk: stop the work of a request nobody waits for."""
        if self._cancelled.is_set():
            raise DecodeCancelled("the request was abandoned")

    def reserve(self, num_bytes: int) -> None:
        """Count an item's budget (``check_decoded_size``) toward the request's."""
        with self._lock:
            total = self.num_reserved_bytes + num_bytes
            if total > self.max_request_bytes:
                raise MediaLimitError(
                    f"the request's media would decode to {total} bytes; "
                    f"the limit is max_request_decoded_bytes = {self.max_request_bytes}"
                )
            self.num_reserved_bytes = total


def admit(num_bytes: int, limits: MediaLimits, kind: str, ticket: DecodeTicket | None) -> None:
    """An item's budget checks, before it is decoded: its own, then its request's (if any)."""
    check_decoded_size(num_bytes, limits, kind)
    if ticket is not None:
        ticket.check()
        ticket.reserve(num_bytes)
