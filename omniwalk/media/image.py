"""Image bytes or arrays -> uint8 RGB [H, W, 3] (Pillow).

EXIF orientation is applied; animated images give their first frame; every other mode
(palette, greyscale, alpha, CMYK, 16-bit) becomes RGB the way the HF processor converts it:
through RGBA composited over white. Size limits and the decoded-size budget (width x height x 3,
``max_image_decoded_bytes``) are checked from the header, before pixels are decoded.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from omniwalk.errors import MediaError
from omniwalk.media.budget import DecodeTicket, admit
from omniwalk.media.errors import CorruptMediaError, MediaLimitError
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits


def check_frame_size(height: int, width: int, limits: MediaLimits, max_pixels: int) -> None:
    """Raise if an image or video frame is too small, too large or too elongated."""
    if min(height, width) < limits.min_image_side:
        raise MediaLimitError(f"image is {width}x{height}; each side must be at least {limits.min_image_side} pixels")
    if height * width > max_pixels:
        raise MediaLimitError(f"image is {width}x{height} = {height * width} pixels; the limit is {max_pixels}")
    if max(height, width) / min(height, width) > limits.max_aspect_ratio:
        raise MediaLimitError(f"image aspect ratio {width}x{height} exceeds {limits.max_aspect_ratio:g}:1")


def decode_image(
    data: bytes | np.ndarray, limits: MediaLimits = DEFAULT_LIMITS, *, ticket: DecodeTicket | None = None
) -> np.ndarray:
    """Encoded bytes (png, jpeg, webp, gif, bmp, ...) or a uint8 [H, W, 3] array -> uint8 [H, W, 3]."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 3 or data.shape[2] != 3:
            raise CorruptMediaError(f"image array must be uint8 [H, W, 3], got {data.dtype} {data.shape}")
        check_frame_size(data.shape[0], data.shape[1], limits, limits.max_image_pixels)
        return np.ascontiguousarray(data)
    if len(data) > limits.max_input_bytes:
        raise MediaLimitError(f"image is {len(data)} bytes; the limit is {limits.max_input_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit applies
            image = Image.open(io.BytesIO(bytes(data)))
            check_frame_size(image.height, image.width, limits, limits.max_image_pixels)
            admit(image.height * image.width * 3, limits, "image", ticket)
            image.seek(0)  # animated formats: first frame
            image = ImageOps.exif_transpose(image)
            return np.asarray(_to_rgb(image))
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError):
        raise CorruptMediaError("could not decode image (unknown format or corrupt data)") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # high bit depth greyscale -> 8 bit
        pixels = np.asarray(image, dtype=np.float64)
        scale = 255.0 / 65535.0 if image.mode != "F" and pixels.max() > 255 else 1.0
        image = Image.fromarray(np.clip(pixels * scale, 0, 255).astype(np.uint8))
    background = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
