"""Bicubic resizing to the vision encoder's grid, as HF's image and video processors do it.

- Images: Pillow ``Image.resize(BICUBIC)`` on the uint8 image, on the CPU in the decode step
  (``Qwen2VLImageProcessorPil`` does exactly this, so the result is bit-exact).
- Video frames: ``F.interpolate(bicubic, antialias=True)`` batched over frames. On the CPU it
  runs torch's native uint8 kernel, which is what torchvision's ``resize`` (and so HF's
  ``Qwen2VLVideoProcessor``) runs on uint8 frames; on other devices it runs in float32, clamped
  and rounded, which differs from the uint8 kernel on noise frames (64x96 -> 320x448) by up to
  24 uint8 levels, 0.22 on average.

Why images are not resized with torch on the device: against Pillow on random-noise images,
torch's antialiased bicubic (Keys a = -0.75; Pillow uses a = -0.5 with fixed-point
weights and a uint8 round-and-clip between its two passes) differs by up to 22 uint8 levels when
upscaling (100x150 -> 96x160: 23% of values differ) and up to 6 when downscaling
(1000^2 -> 512^2); that is up to 0.17 after normalisation to [-1, 1]. A fixed-point port of
Pillow's kernel in torch was bit-exact only when Pillow 13 runs the horizontal pass first; its
pass-order choice for reductions could not be pinned down, so exactness would be luck.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def pil_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pillow bicubic resize of a uint8 [H, W, 3] image to [height, width, 3]."""
    if image.shape[:2] == (height, width):
        return image
    return np.array(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))


def torch_bicubic(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Antialiased bicubic resize of uint8 [N, C, H, W] frames -> uint8 [N, C, height, width]."""
    if tuple(frames.shape[-2:]) == (height, width):
        return frames
    if frames.device.type == "cpu" and frames.dtype == torch.uint8:
        return F.interpolate(frames, size=(height, width), mode="bicubic", antialias=True)
    out = F.interpolate(frames.float(), size=(height, width), mode="bicubic", antialias=True, align_corners=False)
    return out.clamp_(0, 255).round_().to(torch.uint8)
