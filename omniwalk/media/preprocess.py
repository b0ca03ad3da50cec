"""Encoded media bytes -> the arrays a request carries to the engine (decoded, resampled, resized).

The HTTP process runs this in its media pool (``omniwalk.serve.media_pool``), so the engine's
step loop receives arrays only:

    audio  bytes -> float32 [L] at 16 kHz                  {"type": "audio", "audio"}
    image  bytes -> uint8 [h, w, 3] at its smart_resize    {"type": "image", "image"}
    video  bytes -> uint8 [T, h, w, 3] sampled + resized,  {"type": "video", "video", "fps", "audio"}
                    fps = the sampled rate, audio = its track at 16 kHz (or None)

Images and video frames are resized with the served family's ``PatchSpec`` for their kind
(``ModelInfo.patch_specs``; none: kept at their decoded size). These array parts are what the
family's own preprocessing would have made: re-measuring them resizes nothing and keeps every
sampled frame (``tests/media/test_preprocess.py``).
"""

from __future__ import annotations

from omniwalk.media.audio import decode_audio
from omniwalk.media.budget import DecodeTicket
from omniwalk.media.image import decode_image
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.patches import resize_image
from omniwalk.media.video import decode_video


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
        return {"type": "audio", "audio": decode_audio(data, limits, ticket=ticket)}
    if kind == "image":
        image = decode_image(data, limits, ticket=ticket)
        return {"type": "image", "image": image if spec is None else resize_image(image, spec)}
    video = decode_video(data, limits, spec=spec, ticket=ticket)  # (frames resized as they are decoded)
    return {"type": "video", "video": video.frames, "fps": video.sampled_fps, "audio": video.audio}
