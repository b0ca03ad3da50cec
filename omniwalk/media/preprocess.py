"""Encoded media bytes -> the arrays a request carries to the engine (decoded, resampled, resized).

The HTTP process runs this in its media pool (``omniwalk.serve.media_pool``), so the engine's
step loop receives arrays only:

    audio  bytes -> float32 [L] at 16 kHz                  {"type": "audio", "audio", "digest"}
    image  bytes -> uint8 [h, w, 3] at its smart_resize    {"type": "image", "image", "digest"}
    video  bytes -> uint8 [T, h, w, 3] sampled + resized,  {"type": "video", "video", "fps", "audio", "digest"}
                    fps = the sampled rate, audio = its track at 16 kHz (or None)

``digest`` (bytes, which JSON cannot carry: only this process makes one) names the part's content: the
engine keys prefix pages by it instead of hashing the arrays again on its step loop (a realtime
session's recordings are hashed once, not at every turn).

Images and video frames are resized with the served family's ``PatchSpec`` for their kind
(``ModelInfo.patch_specs``; none: kept at their decoded size). These array parts are what the
family's own preprocessing would have made: re-measuring them resizes nothing and keeps every
sampled frame (``tests/media/test_preprocess.py``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from omniwalk.media.audio import decode_audio
from omniwalk.media.budget import DecodeTicket
from omniwalk.media.image import decode_image
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.patches import resize_image
from omniwalk.media.video import decode_video

DIGEST = "digest"  # an array part's content digest (``content_digest``)


def preprocess(
    kind: str,
    data: bytes,
    limits: MediaLimits = DEFAULT_LIMITS,
    spec: PatchSpec | None = None,
    ticket: DecodeTicket | None = None,
) -> dict:
    """One media item's bytes -> its array content part, an image or video resized by ``spec``
    (raises ``MediaError`` subclasses, or ``DecodeCancelled`` once ``ticket`` is cancelled)."""
    if kind == "audio":
        part = {"type": "audio", "audio": decode_audio(data, limits, ticket=ticket)}
    elif kind == "image":
        image = decode_image(data, limits, ticket=ticket)
        part = {"type": "image", "image": image if spec is None else resize_image(image, spec)}
    else:
        video = decode_video(data, limits, spec=spec, ticket=ticket)  # (frames resized as they are decoded)
        part = {"type": "video", "video": video.frames, "fps": video.sampled_fps, "audio": video.audio}
    part[DIGEST] = content_digest(part)
    return part


def content_digest(part: dict) -> bytes:
    """A digest of an array part's content: every field but the digest (arrays by dtype, shape and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    feed_digest(h, {name: value for name, value in part.items() if name != DIGEST})
    return h.digest()


def feed_digest(h, value) -> None:
    """Hash ``value`` into ``h``: dicts by sorted key, sequences in order, arrays and tensors by
    dtype, shape and bytes, anything else by its ``repr``."""
    if isinstance(value, dict):
        for name in sorted(value):
            h.update(repr(name).encode())
            feed_digest(h, value[name])
    elif isinstance(value, list | tuple):
        for v in value:
            feed_digest(h, v)
    elif isinstance(value, torch.Tensor):
        h.update(repr((str(value.dtype), tuple(value.shape))).encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, np.ndarray):
        h.update(repr((value.dtype.str, value.shape)).encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
    else:
        h.update(repr(value).encode())
