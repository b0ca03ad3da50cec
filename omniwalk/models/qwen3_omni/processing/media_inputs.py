"""Request media parts -> measured ``MediaItem``s (decoded, preprocessed, counted).

    part (array | base64 | data URL | allowed URL/path) --decode--> waveform / uint8 image / frames
      --measure--> MediaItem (token count or grid; waveform or resized uint8 pixels)  [prompt building]
      --vision_pixels--> normalised patches, made on the encoder's device          [encoder stage]

The encoder stages (``encoder_programs.py``) then run the encoders over the items of many
requests at once.
"""

from __future__ import annotations

import numpy as np
import torch

from omniwalk.device import to_device
from omniwalk.media.audio import decode_audio
from omniwalk.media.image import decode_image
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.mel import num_mel_frames
from omniwalk.media.patches import (
    VIDEO_PATCHES,
    image_patches,
    patch_grid,
    resize_image,
    resize_video,
    resized_video_patches,
    seconds_per_grid,
)
from omniwalk.media.payload import part_payload
from omniwalk.media.video import decode_video
from omniwalk.models.common.processing.chat import MediaItem, MediaPart
from omniwalk.models.common.processing.positions import AUDIO, IMAGE, VIDEO
from omniwalk.models.qwen3_omni.networks.audio_encoder import audio_output_lengths


def measure(part: MediaPart, n_window: int, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """Decode and measure one part; ``data`` holds the waveform, or the pixels resized for the
    vision encoder (uint8: ``image`` [h, w, 3], video ``frames`` [T, 3, h, w])."""
    p = part.part
    if part.kind == AUDIO:
        wave = decode_audio(part_payload(p, "audio", "input_audio", "audio_url", limits), limits)
        return MediaItem(AUDIO, _num_audio_tokens(wave, n_window), data={"audio": wave})
    if part.kind == IMAGE:
        image = torch.from_numpy(
            resize_image(decode_image(part_payload(p, "image", None, "image_url", limits), limits))
        )
        return MediaItem(IMAGE, grid_thw=patch_grid(1, *image.shape[:2]), data={"image": image})
    video = decode_video(part_payload(p, "video", None, "video_url", limits), limits, fps=p.get("fps"))
    track = video.audio if p.get("audio") is None else decode_audio(np.asarray(p["audio"]), limits)
    frames = resize_video(torch.from_numpy(video.frames))
    grid = patch_grid(len(frames), *frames.shape[2:], VIDEO_PATCHES)
    tokens = 0 if track is None else _num_audio_tokens(track, n_window)
    return MediaItem(VIDEO, tokens, grid, seconds_per_grid(video.sampled_fps), {"frames": frames, "audio": track})


def vision_pixels(item: MediaItem, device) -> torch.Tensor:
    """An image or video item's vision-encoder input (float32 patches), made on ``device`` from
    its resized uint8 pixels."""
    if item.kind == IMAGE:
        return image_patches(to_device(item.data["image"], device))[0]
    return resized_video_patches(to_device(item.data["frames"], device))[0]


def _num_audio_tokens(wave: np.ndarray, n_window: int) -> int:
    """The encoder's output length for the clip (from its length: no features are computed here)."""
    return int(audio_output_lengths(num_mel_frames(len(wave)), n_window))
