"""Typed media errors, one per cause, so the HTTP layer maps each to a clear 4xx body."""

from omniwalk.errors import MediaError


class CorruptMediaError(MediaError):
    """Bytes that no decoder accepts (truncated, wrong format, not media at all)."""


class EmptyMediaError(MediaError):
    """Media that decodes to nothing usable: no samples, no frames, a too-short clip."""


class MediaLimitError(MediaError):
    """Media that decodes but violates a configured limit (duration, pixels, aspect ratio, ...)."""


class DecodeCancelled(Exception):  # noqa: N818 - not an error of the media: its request is gone
    """The request whose media this is was abandoned (its client hung up): decoding stops. Not a
    ``MediaError``: it is no 400, and the HTTP layer answers (and counts) a 499."""
