"""Media decoded in the HTTP process's pool (``preprocess``) measure exactly as the engine's own
decoding of the same bytes would: same token counts and grids, same waveform and pixels."""

import base64

import numpy as np
import pytest
import torch
from media_samples import encode_audio, encode_image, encode_video, gradient_image, tone

from omniwalk.media.preprocess import preprocess
from omniwalk.models.common.processing.chat import MediaPart
from omniwalk.models.qwen3_omni.processing.media_inputs import measure

N_WINDOW = 50


def _samples():
    frames = np.stack([gradient_image(100, 150, seed=i) for i in range(9)])
    return [
        ("audio", "input_audio", encode_audio(tone(1.3, 44100, 2), 44100, "WAV")),
        ("audio", "audio_url", encode_audio(tone(0.7, 22050), 22050, "MP3")),
        ("image", "image_url", encode_image(gradient_image(90, 130), "PNG")),
        ("image", "image_url", encode_image(gradient_image(1000, 700), "JPEG")),
        ("video", "video_url", encode_video(frames, 6, audio=tone(1.5))),
        ("video", "video_url", encode_video(np.stack([gradient_image(720, 1280, seed=1)] * 3), 1)),
    ]


@pytest.mark.parametrize("kind, key, data", _samples())
def test_preprocessed_parts_measure_as_the_bytes_do(kind, key, data):
    b64 = base64.b64encode(data).decode()
    original = {"type": key, key: {"data": b64} if key == "input_audio" else {"url": f"data:x;base64,{b64}"}}
    want = measure(MediaPart(kind, original), N_WINDOW)
    got = measure(MediaPart(kind, preprocess(kind, data)), N_WINDOW)
    assert (got.kind, got.num_audio_tokens, got.grid_thw) == (want.kind, want.num_audio_tokens, want.grid_thw)
    assert got.seconds_per_grid == pytest.approx(want.seconds_per_grid, rel=1e-12)
    assert want.data.keys() == got.data.keys()
    for name, value in want.data.items():
        if value is None:
            assert got.data[name] is None
        else:
            assert torch.equal(torch.as_tensor(got.data[name]), torch.as_tensor(value)), name
