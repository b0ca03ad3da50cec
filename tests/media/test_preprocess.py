"""Media decoded in the HTTP process's pool (``preprocess``, resized by the served family's
``ModelInfo.patch_specs``) measure exactly as the family's own decoding of the same bytes would:
same token counts and grids, same waveform and pixels, for each family's resizing."""

import base64
import dataclasses
from functools import partial

import numpy as np
import pytest
import torch
from helpers.media_samples import encode_audio, encode_image, encode_video, gradient_image, tone

from omniwalk.media.preprocess import preprocess
from omniwalk.models.common.processing.chat import MediaPart
from omniwalk.models.family import ModelInfo
from omniwalk.models.qwen2_5_omni.processing import media_inputs as qwen2_5
from omniwalk.models.qwen3_omni import family as qwen3_family
from omniwalk.models.qwen3_omni.processing import media_inputs as qwen3
from omniwalk.serve.wire import Ready, pack, unpack

N_WINDOW = 50
# family -> (its measure, its declared resizing)
FAMILIES = {
    "qwen3_omni": (partial(qwen3.measure, n_window=N_WINDOW), qwen3_family.PATCH_SPECS),
    "qwen2_5_omni": (qwen2_5.measure, qwen2_5.PATCH_SPECS),
}


def _frames(height: int, width: int, count: int) -> np.ndarray:
    return np.stack([gradient_image(height, width, seed=i) for i in range(count)])


# name -> (kind, content part key, encoded bytes made on use: PyAV encodes the videos)
SAMPLES = {
    "wav": ("audio", "input_audio", lambda: encode_audio(tone(1.3, 44100, 2), 44100, "WAV")),
    "mp3": ("audio", "audio_url", lambda: encode_audio(tone(0.7, 22050), 22050, "MP3")),
    "png": ("image", "image_url", lambda: encode_image(gradient_image(90, 130), "PNG")),
    # sides no multiple of 28 or 32 (either family's merged patch)
    "png_37x50": ("image", "image_url", lambda: encode_image(gradient_image(37, 50), "PNG")),
    "png_45x70": ("image", "image_url", lambda: encode_image(gradient_image(45, 70), "PNG")),
    "jpeg": ("image", "image_url", lambda: encode_image(gradient_image(1000, 700), "JPEG")),
    "mp4_audio": ("video", "video_url", lambda: encode_video(_frames(100, 150, 9), 6, audio=tone(1.5))),
    "mp4_38x50": ("video", "video_url", lambda: encode_video(_frames(38, 50, 5), 2)),
    "mp4_720p": ("video", "video_url", lambda: encode_video(np.stack([gradient_image(720, 1280, seed=1)] * 3), 1)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("sample", list(SAMPLES))
def test_preprocessed_parts_measure_as_the_bytes_do(family, sample):
    kind, key, make = SAMPLES[sample]
    if kind == "video":
        pytest.importorskip("av", reason="PyAV encodes the test videos")
    data, (measure, specs) = make(), FAMILIES[family]
    b64 = base64.b64encode(data).decode()
    original = {"type": key, key: {"data": b64} if key == "input_audio" else {"url": f"data:x;base64,{b64}"}}
    want = measure(MediaPart(kind, original))
    got = measure(MediaPart(kind, preprocess(kind, data, spec=specs.get(kind))))
    assert (got.kind, got.num_audio_tokens, got.grid_thw) == (want.kind, want.num_audio_tokens, want.grid_thw)
    assert got.seconds_per_grid == pytest.approx(want.seconds_per_grid, rel=1e-12)
    assert want.data.keys() == got.data.keys()
    for name, value in want.data.items():
        if value is None:
            assert got.data[name] is None
        else:
            assert torch.equal(torch.as_tensor(got.data[name]), torch.as_tensor(value)), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_specs_cross_the_wire_whole(family):
    """The engine process sends its ``ModelInfo`` as a dict (``Ready``); the server's copy is equal."""
    info = ModelInfo("m", ("text", "audio"), ("a", "b"), 24000, {"x": "flag"}, ("x",), patch_specs=FAMILIES[family][1])
    received = ModelInfo.from_dict(unpack(pack(Ready(dataclasses.asdict(info)))).info)
    assert received == info  # (PatchSpec tuples included: a list would not compare equal)
