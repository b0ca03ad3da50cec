"""Video decoding/sampling and the Qwen2-VL video processor math (HF's needs torchvision, so the
oracle here is an explicit per-patch loop written from the processor's documented layout; the
real HF video processor is compared in test_video_hf.py where torchvision exists)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.media_samples import encode_video, gradient_image, tone
from helpers.single_request import video_patches

from omniwalk.media.errors import CorruptMediaError, EmptyMediaError, MediaLimitError
from omniwalk.media.limits import MediaLimits
from omniwalk.media.patches import VIDEO_PATCHES, seconds_per_grid, smart_resize
from omniwalk.media.video import decode_video, sample_frame_indices


def _oracle_patches(frames: np.ndarray):
    """uint8 [T, H, W, 3] -> patches, grid: torchvision-style bicubic resize, pairs of frames,
    2x2 merge blocks, each patch flattened as (C, t, ph, pw)."""
    spec, p = VIDEO_PATCHES, VIDEO_PATCHES.patch_size
    h, w = smart_resize(frames.shape[1], frames.shape[2], spec)
    x = torch.from_numpy(frames).permute(0, 3, 1, 2)
    x = F.interpolate(x, size=(h, w), mode="bicubic", antialias=True).float()  # torchvision's uint8 path
    x = (x / 255 - 0.5) / 0.5
    if len(x) % 2:
        x = torch.cat([x, x[-1:]])
    rows = []
    for g in range(len(x) // 2):
        for br in range(h // p // 2):
            for bc in range(w // p // 2):
                for ir in range(2):
                    for ic in range(2):
                        r, c = (2 * br + ir) * p, (2 * bc + ic) * p
                        rows.append(x[2 * g : 2 * g + 2, :, r : r + p, c : c + p].permute(1, 0, 2, 3).reshape(-1))
    return torch.stack(rows), (len(x) // 2, h // p, w // p)


@pytest.mark.parametrize("num_frames,height,width", [(4, 64, 96), (5, 100, 150), (2, 360, 640), (3, 32, 32)])
def test_video_patches_match_processor_layout(num_frames, height, width):
    frames = np.stack([gradient_image(height, width, seed=i) for i in range(num_frames)])
    pixels, grid = video_patches(torch.from_numpy(frames))
    ref, ref_grid = _oracle_patches(frames)
    assert grid == ref_grid and grid[0] == (num_frames + 1) // 2
    torch.testing.assert_close(pixels, ref, atol=1e-6, rtol=0)


def test_video_size_bounds_are_the_processors():
    # the Qwen3-Omni processor's video bounds: 128..768 merged tokens per frame
    assert smart_resize(64, 96, VIDEO_PATCHES) == (320, 448)
    assert smart_resize(2160, 3840, VIDEO_PATCHES) == (640, 1152)
    for h, w in [(64, 96), (2160, 3840), (480, 640)]:
        rh, rw = smart_resize(h, w, VIDEO_PATCHES)
        assert 128 <= rh * rw // 1024 <= 768


@pytest.mark.parametrize(
    "total,fps,expected",
    [(300, 30.0, 20), (30, 30.0, 4), (3, 30.0, 2), (1, 30.0, 1), (10000, 10.0, 768), (7, 1.0, 6)],
)
def test_frame_sampling(total, fps, expected):
    idx = sample_frame_indices(total, fps, MediaLimits())
    assert len(idx) == expected and idx[0] == 0 and idx[-1] == total - 1
    assert (np.diff(idx) >= 0).all()


def test_seconds_per_grid():
    assert seconds_per_grid(2.0) == 1.0 and seconds_per_grid(1.0) == 2.0


def _panning_card(height: int, width: int, frame: int) -> np.ndarray:
    """uint8 [H, W, 3]: smooth gradients panning a little each frame (no noise, so a lossy codec keeps
    each frame to a mean error of ~2 while consecutive frames differ by ~7.5 and the phase never wraps
    over 25 frames: a decoded frame is unmistakably its own)."""
    y, x = np.mgrid[0:height, 0:width]
    colour = np.array([1.0, 0.6, -0.8])
    pan = 60 * np.sin(x / width * 6.0 + 0.2 * frame)[..., None]
    base = 127 + pan + 60 * np.cos(y / height * 4.0)[..., None] * colour
    return np.clip(base, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("fmt,codec", [("mp4", "libx264"), ("webm", "libvpx-vp9")])
def test_decodes_video_with_audio_track(fmt, codec):
    frames = np.stack([_panning_card(48, 64, i) for i in range(25)])  # 2.5 s at 10 fps
    decoded = decode_video(encode_video(frames, 10, fmt, codec, audio=tone(2.5)))
    assert decoded.frames.dtype == np.uint8 and decoded.frames.shape == (4, 48, 64, 3)
    assert decoded.sampled_fps == pytest.approx(4 / 25 * 10)
    assert decoded.audio is not None and abs(len(decoded.audio) - 40000) < 2000
    # each sampled frame is the uniformly spaced one: within the codec's error of it (~2) and nearer to
    # it than to any other source frame (the nearest other is ~7.5 away, so one frame off fails)
    for out, i in zip(decoded.frames, sample_frame_indices(25, 10.0, MediaLimits()), strict=True):
        errors = np.abs(out.astype(int)[None] - frames.astype(int)).mean(axis=(1, 2, 3))
        assert errors[i] < 3.5 and errors.argmin() == i, (i, errors.round(1))


def test_video_without_audio_and_array_input():
    frames = np.stack([gradient_image(32, 48, seed=i) for i in range(20)])
    assert decode_video(encode_video(frames, 10)).audio is None
    decoded = decode_video(frames, fps=10.0)
    assert decoded.frames.shape == (4, 32, 48, 3) and decoded.sampled_fps == pytest.approx(2.0)
    np.testing.assert_array_equal(decoded.frames[0], frames[0])


@pytest.mark.parametrize(
    "kwargs,limits,error",
    [
        ({"data": b"\x00\x00\x00\x18ftypmp42 garbage"}, MediaLimits(), CorruptMediaError),
        ({"data": tone(1.0).tobytes()}, MediaLimits(), CorruptMediaError),
        ({"data": np.zeros((4, 8, 8, 3), np.uint8)}, MediaLimits(), CorruptMediaError),  # no fps
        ({"data": np.zeros((4, 8, 8), np.uint8), "fps": 2.0}, MediaLimits(), CorruptMediaError),
        ({"data": np.zeros((0, 8, 8, 3), np.uint8), "fps": 2.0}, MediaLimits(), EmptyMediaError),
        ({"data": np.zeros((100, 8, 8, 3), np.uint8), "fps": 2.0}, MediaLimits(max_video_seconds=10), MediaLimitError),
        ({"data": np.zeros((2, 1, 8, 3), np.uint8), "fps": 2.0}, MediaLimits(), MediaLimitError),
        ({"data": np.zeros((2, 64, 64, 3), np.uint8), "fps": 2.0}, MediaLimits(max_video_pixels=1000), MediaLimitError),
    ],
    ids=["garbage", "raw-pcm", "array-no-fps", "array-3d", "no-frames", "too-long", "1-pixel-high", "too-large"],
)
def test_bad_video_raises_typed_error(kwargs, limits, error):
    with pytest.raises(error):
        decode_video(limits=limits, **kwargs)


def test_long_encoded_video_is_refused_before_decoding():
    frames = np.stack([gradient_image(16, 16, seed=i) for i in range(60)])
    with pytest.raises(MediaLimitError, match="s long"):
        decode_video(encode_video(frames, 10), MediaLimits(max_video_seconds=3.0))
