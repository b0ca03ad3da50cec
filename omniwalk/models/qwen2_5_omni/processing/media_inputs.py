"""Request media parts -> measured ``MediaItem``s, as the Qwen2.5-Omni processor measures them.

The flow is the other family's (decode the part, measure, resize) with this model's numbers:
audio featurised as the processor pads it (zeros after the clip: ``ceil(len / 160)`` mel frames)
and cut to the processor's 300 s, as it cuts longer clips (``MAX_AUDIO_SAMPLES``),
14-pixel patches (a merged token covers 28 x 28 pixels) normalised with CLIP's mean and std,
video frames within [128, 768] merged tokens' worth of pixels.
"""

from __future__ import annotations

import numpy as np
import torch

from omniwalk.device import to_device
from omniwalk.media.audio import decode_audio
from omniwalk.media.image import decode_image
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.mel import num_mel_frames
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.patches import (
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
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import audio_output_lengths

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
IMAGE_PATCHES = PatchSpec(patch_size=14, mean=CLIP_MEAN, std=CLIP_STD)
MAX_AUDIO_SAMPLES = 300 * 16000  # the feature extractor's n_samples (preprocessor_config.json)
VIDEO_PATCHES = PatchSpec(
    patch_size=14, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28, mean=CLIP_MEAN, std=CLIP_STD
)
PATCH_SPECS = {IMAGE: IMAGE_PATCHES, VIDEO: VIDEO_PATCHES}  # ModelInfo.patch_specs: the server resizes so too


def measure(part: MediaPart, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """Decode and measure one part; ``data`` holds the waveform, or the pixels resized for the
    vision encoder (uint8: ``image`` [h, w, 3], video ``frames`` [T, 3, h, w])."""
    p = part.part
    if part.kind == AUDIO:
        wave = decode_audio(part_payload(p, "audio", "input_audio", "audio_url", limits), limits)[:MAX_AUDIO_SAMPLES]
        return MediaItem(AUDIO, num_audio_tokens(wave), data={"audio": wave})
    if part.kind == IMAGE:
        image = part_payload(p, "image", None, "image_url", limits)
        image = torch.from_numpy(resize_image(decode_image(image, limits), IMAGE_PATCHES))
        return MediaItem(IMAGE, grid_thw=patch_grid(1, *image.shape[:2], IMAGE_PATCHES), data={"image": image})
    video = decode_video(part_payload(p, "video", None, "video_url", limits), limits, fps=p.get("fps"))
    track = video.audio if p.get("audio") is None else decode_audio(np.asarray(p["audio"]), limits)
    track = None if track is None else track[:MAX_AUDIO_SAMPLES]
    frames = resize_video(torch.from_numpy(video.frames), VIDEO_PATCHES)
    grid = patch_grid(len(frames), *frames.shape[2:], VIDEO_PATCHES)
    tokens = 0 if track is None else num_audio_tokens(track)
    spg = seconds_per_grid(video.sampled_fps, VIDEO_PATCHES)
    return MediaItem(VIDEO, tokens, grid, spg, {"frames": frames, "audio": track})


def num_audio_tokens(wave: np.ndarray) -> int:
    return int(audio_output_lengths(num_mel_frames(len(wave), zero_tail=True)))


def vision_pixels(item: MediaItem, device) -> torch.Tensor:
    """An image or video item's vision-encoder input (float32 patches), made on ``device``."""
    if item.kind == IMAGE:
        return image_patches(to_device(item.data["image"], device), IMAGE_PATCHES)[0]
    return resized_video_patches(to_device(item.data["frames"], device), VIDEO_PATCHES)[0]
