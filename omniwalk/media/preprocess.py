"""Encoded media bytes -> the arrays a request carries to the engine (decoded, resampled, resized).

The HTTP process runs this in its media pool (``omniwalk.serve.media_pool``), so the engine's
step loop receives arrays only:

    audio  bytes -> float32 [L] at 16 kHz                  {"type": "audio", "audio"}
    image  bytes -> uint8 [h, w, 3] at its smart_resize    {"type": "image", "image"}
    video  bytes -> uint8 [T, h, w, 3] sampled + resized,  {"type": "video", "video", "fps", "audio"}
                    fps = the sampled rate, audio = its track at 16 kHz (or None)

These array parts are what the engine's own preprocessing would have made: re-measuring them
resizes nothing and keeps every sampled frame (``tests/test_media_preprocess.py``).
"""

from __future__ import annotations

import torch

from omniwalk.media.audio import decode_audio
from omniwalk.media.image import decode_image
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.patches import resize_image, resize_video
from omniwalk.media.video import decode_video


def preprocess(kind: str, data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> dict:
    """One media item's bytes -> its array content part (raises ``MediaError`` subclasses)."""
    if kind == "audio":
        return {"type": "audio", "audio": decode_audio(data, limits)}
    if kind == "image":
        return {"type": "image", "image": resize_image(decode_image(data, limits))}
    video = decode_video(data, limits)
    frames = resize_video(torch.from_numpy(video.frames)).permute(0, 2, 3, 1).contiguous().numpy()
    return {"type": "video", "video": frames, "fps": video.sampled_fps, "audio": video.audio}
