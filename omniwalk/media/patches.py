"""Images and video frames -> flattened patches for the vision encoder (HF's ``Qwen2VLImageProcessor`` math).

    pixel_values [num_patches, C * temporal_patch * patch * patch]   float32, normalised
    grid_thw     (grid_t, grid_h, grid_w)                            num_patches = t * h * w

Patches are emitted frame-group by frame-group, and inside a frame group in 2x2 merge-block
order (block_row, block_col, in_row, in_col); each patch vector is (C, t, ph, pw) flattened.
An image is one frame repeated ``temporal_patch_size`` times; a video's frames are grouped in
consecutive pairs (the last frame repeated if the count is odd).

Resizing happens on the CPU, where it is exact (``resize.py`` says why): images with Pillow
(``resize_image``), video frames with torch's uint8 kernel (``resize_video``). The resized uint8
pixels then travel to the device (8x fewer bytes than the patches), where ``image_patches`` and
``resized_video_patches`` normalise and cut them (both run on any device).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from omniwalk.media.errors import MediaLimitError
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.resize import pil_bicubic, torch_bicubic

IMAGE_PATCHES = PatchSpec()
# The default family's video bounds (its HF processor overrides the video processor's).
VIDEO_PATCHES = PatchSpec(min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32)
MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, spec: PatchSpec = IMAGE_PATCHES) -> tuple[int, int]:
    """Target (height, width): multiples of ``spec.factor``, area within the pixel budget.

    Rounding is Python's ``round`` (half to even: 720 / 32 = 22.5 -> 22), as HF does.
    """
    if min(height, width) < 1 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaLimitError(f"image aspect ratio {width}x{height} exceeds {MAX_ASPECT_RATIO}:1")
    f = spec.factor
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > spec.max_pixels:
        beta = math.sqrt(height * width / spec.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def resize_image(image: np.ndarray, spec: PatchSpec = IMAGE_PATCHES) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [h, w, 3] at the smart_resize size (Pillow bicubic, CPU)."""
    return pil_bicubic(image, *smart_resize(image.shape[0], image.shape[1], spec))


def patch_grid(num_frames: int, height: int, width: int, spec: PatchSpec = IMAGE_PATCHES) -> tuple[int, int, int]:
    """grid_thw of ``num_frames`` frames already at their smart_resize size (an image is 1 frame)."""
    return -(-num_frames // spec.temporal_patch_size), height // spec.patch_size, width // spec.patch_size


def _normalise(frames: torch.Tensor, spec: PatchSpec) -> torch.Tensor:
    """[T, C, H, W] values in 0..255 -> float32 (x / 255 - mean) / std, channel by channel with
    scalar constants (no host-to-device copy)."""
    x = frames.float() / 255.0
    if len(set(spec.mean)) == 1 and len(set(spec.std)) == 1:
        return (x - spec.mean[0]) / spec.std[0]
    return torch.stack([(x[:, c] - m) / s for c, (m, s) in enumerate(zip(spec.mean, spec.std, strict=True))], 1)


def patchify(frames: torch.Tensor, spec: PatchSpec) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[T, C, H, W] (T a multiple of temporal_patch_size, H/W of factor) -> (pixel_values, grid_thw)."""
    num_frames, channels, height, width = frames.shape
    p, m, tp = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    gt, gh, gw = num_frames // tp, height // p, width // p
    x = frames.reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    # -> (t, block_row, block_col, in_row, in_col, C, tp, ph, pw)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, channels * tp * p * p), (gt, gh, gw)


def image_patches(image: torch.Tensor, spec: PatchSpec = IMAGE_PATCHES) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [h, w, 3] already at its ``smart_resize`` size (any device) -> patches and grid."""
    if tuple(image.shape[:2]) != smart_resize(image.shape[0], image.shape[1], spec):
        raise ValueError(f"image {tuple(image.shape[:2])} is not at its smart_resize size; call resize_image")
    frame = _normalise(image.permute(2, 0, 1)[None], spec)
    return patchify(frame.expand(spec.temporal_patch_size, -1, -1, -1), spec)


def resize_video(frames: torch.Tensor, spec: PatchSpec = VIDEO_PATCHES) -> torch.Tensor:
    """uint8 [T, H, W, 3] sampled frames -> uint8 [T, 3, h, w] at the smart_resize size."""
    height, width = smart_resize(frames.shape[1], frames.shape[2], spec)
    return torch_bicubic(frames.permute(0, 3, 1, 2), height, width)


def resized_video_patches(
    frames: torch.Tensor, spec: PatchSpec = VIDEO_PATCHES
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, 3, h, w] frames from ``resize_video`` (any device) -> normalised patches and grid;
    an odd last frame is repeated to fill its temporal patch."""
    if pad := -frames.shape[0] % spec.temporal_patch_size:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    return patchify(_normalise(frames, spec), spec)


def seconds_per_grid(sampled_fps: float, spec: PatchSpec = VIDEO_PATCHES) -> float:
    """Seconds of video covered by one temporal patch (``video_second_per_grid`` for MRoPE)."""
    return spec.temporal_patch_size / sampled_fps
