"""Image decoding (real codecs, typed errors) and patches vs HF's Qwen2VLImageProcessorPil."""

import numpy as np
import pytest
import torch
from helpers.media_samples import encode_image, gradient_image
from helpers.processor_oracle import hf_image_processor
from PIL import Image

from omniwalk.media.errors import CorruptMediaError, MediaLimitError
from omniwalk.media.image import decode_image
from omniwalk.media.limits import MediaLimits
from omniwalk.media.patches import IMAGE_PATCHES, image_patches, resize_image, smart_resize


@pytest.fixture(scope="module")
def processor():
    return hf_image_processor()


SIZES = [(10, 10), (100, 150), (448, 448), (720, 1280), (3000, 4000), (30, 5000), (5000, 30), (7, 1300), (33, 65)]


@pytest.mark.parametrize("height,width", SIZES)
def test_patches_match_hf(processor, height, width):
    image = gradient_image(height, width)
    ref = processor(images=[image], return_tensors="pt")
    pixels, grid = image_patches(torch.from_numpy(resize_image(image)))
    assert [list(grid)] == ref["image_grid_thw"].tolist()
    # both resize with Pillow, so the only difference is float rounding of the normalisation
    torch.testing.assert_close(pixels, ref["pixel_values"], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "size,expected",
    [
        ((720, 1280), (704, 1280)),
        ((10, 10), (64, 64)),
        ((100, 150), (96, 160)),
        ((3000, 4000), (3008, 4000)),
        ((1080, 1920), (1088, 1920)),
        ((16000, 16000), (3584, 3584)),
    ],
)
def test_smart_resize_rounds_half_to_even_and_respects_budget(size, expected):
    assert smart_resize(*size) == expected
    h, w = smart_resize(*size)
    assert h % 32 == w % 32 == 0 and IMAGE_PATCHES.min_pixels <= h * w <= IMAGE_PATCHES.max_pixels


def test_image_patches_rejects_unresized_input():
    with pytest.raises(ValueError, match="resize_image"):
        image_patches(torch.zeros(100, 150, 3, dtype=torch.uint8))


@pytest.mark.parametrize(
    "fmt,args", [("PNG", {}), ("JPEG", {"quality": 95}), ("WEBP", {"lossless": True}), ("BMP", {})]
)
def test_decodes_codecs(fmt, args):
    image = gradient_image(40, 60)
    out = decode_image(encode_image(image, fmt, **args))
    assert out.dtype == np.uint8 and out.shape == (40, 60, 3)
    assert np.abs(out.astype(int) - image).mean() < (8 if fmt == "JPEG" else 1e-9)  # JPEG subsamples the noisy chroma


def test_gif_gives_first_frame():
    frames = [Image.fromarray(np.full((20, 30, 3), v, np.uint8)) for v in (0, 255)]
    data = encode_image(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(data).max() == 0


def test_exif_orientation_is_applied():
    image = Image.fromarray(gradient_image(20, 40))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    out = decode_image(encode_image(image, "JPEG", exif=exif, quality=95))
    assert out.shape == (40, 20, 3)


def test_modes_become_rgb_like_hf():
    rgba = np.zeros((10, 12, 4), np.uint8)
    rgba[..., 0], rgba[:5, :, 3] = 200, 255  # top half opaque red, bottom transparent
    out = decode_image(encode_image(rgba, "PNG"))
    assert out[0, 0].tolist() == [200, 0, 0] and out[-1, -1].tolist() == [255, 255, 255]
    grey = decode_image(encode_image(Image.fromarray(np.full((8, 8), 77, np.uint8), "L"), "PNG"))
    assert grey.shape == (8, 8, 3) and (grey == 77).all()
    palette = Image.fromarray(gradient_image(8, 8)).convert("P")
    assert decode_image(encode_image(palette, "PNG")).shape == (8, 8, 3)
    deep = decode_image(encode_image(Image.fromarray(np.full((8, 8), 65535, np.uint16)), "PNG"))
    assert (deep == 255).all()


@pytest.mark.parametrize(
    "data,limits,error",
    [
        (b"\x89PNG\r\n\x1a\n garbage", MediaLimits(), CorruptMediaError),
        (encode_image(gradient_image(40, 60), "PNG")[:100], MediaLimits(), CorruptMediaError),
        (encode_image(np.zeros((1, 1, 3), np.uint8), "PNG"), MediaLimits(), MediaLimitError),
        (encode_image(np.zeros((2, 500, 3), np.uint8), "PNG"), MediaLimits(), MediaLimitError),
        (encode_image(np.zeros((100, 100, 3), np.uint8), "PNG"), MediaLimits(max_image_pixels=5000), MediaLimitError),
        (encode_image(np.zeros((10, 10, 3), np.uint8), "PNG"), MediaLimits(max_input_bytes=10), MediaLimitError),
        (np.zeros((10, 10), np.uint8), MediaLimits(), CorruptMediaError),
        (np.zeros((10, 10, 3), np.float32), MediaLimits(), CorruptMediaError),
    ],
    ids=["garbage", "truncated", "1x1", "aspect>200", "too-large", "too-many-bytes", "2d-array", "float-array"],
)
def test_bad_images_raise_typed_error(data, limits, error):
    with pytest.raises(error):
        decode_image(data, limits)


def test_limit_errors_say_why():
    with pytest.raises(MediaLimitError, match="at least 2 pixels"):
        decode_image(encode_image(np.zeros((1, 1, 3), np.uint8), "PNG"))
    with pytest.raises(MediaLimitError, match="aspect ratio"):
        decode_image(encode_image(np.zeros((2, 500, 3), np.uint8), "PNG"))
    with pytest.raises(MediaLimitError, match="aspect ratio"):
        smart_resize(10, 2010)


def _items():
    from omniwalk.media.patches import resize_video
    from omniwalk.models.common.processing.chat import MediaItem

    rng = np.random.default_rng(0)
    image = torch.from_numpy(resize_image(rng.integers(0, 256, (100, 150, 3), dtype=np.uint8)))
    frames = resize_video(torch.from_numpy(rng.integers(0, 256, (3, 64, 96, 3), dtype=np.uint8)))
    return [MediaItem("image", data={"image": image}), MediaItem("video", data={"frames": frames})]


def test_measured_items_give_the_processor_pixels(processor):
    """An image part measured for a request (resized uint8 kept) turns into HF's pixel values in
    the encoder stage; a 3-frame video item pads its last temporal patch."""
    from omniwalk.models.common.processing.chat import MediaPart
    from omniwalk.models.qwen3_omni.processing.media_inputs import measure, vision_pixels

    image = gradient_image(100, 150)
    item = measure(MediaPart("image", {"type": "image", "image": image}), n_window=50)
    ref = processor(images=[image], return_tensors="pt")
    assert [list(item.grid_thw)] == ref["image_grid_thw"].tolist() and item.data["image"].dtype == torch.uint8
    torch.testing.assert_close(vision_pixels(item, "cpu"), ref["pixel_values"], atol=1e-6, rtol=0)
    _, video = _items()
    _, _, h, w = video.data["frames"].shape
    assert vision_pixels(video, "cpu").shape[0] == 2 * (h // 16) * (w // 16)


@pytest.mark.gpu
def test_vision_pixels_on_the_gpu_equal_the_cpu_ones():
    """Same uint8 pixels in, same patches out, to float32 rounding (measured on the H200: not bit
    for bit, CUDA divides by a scalar as a multiply by its reciprocal)."""
    from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

    for item in _items():
        gpu, cpu = vision_pixels(item, "cuda").cpu(), vision_pixels(item, "cpu")
        print(f"GPU-PIXELS {item.kind}: bitwise {torch.equal(gpu, cpu)}, max abs {(gpu - cpu).abs().max().item():.2e}")
        torch.testing.assert_close(gpu, cpu, atol=1e-6, rtol=0)
