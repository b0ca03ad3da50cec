"""Media decoded in the HTTP process's pool (``preprocess``, resized by the served family's
``ModelInfo.patch_specs``) measure exactly as the family's own decoding of the same bytes would:
same token counts and grids, same waveform and pixels, for each family's resizing.

Each part names its content with a digest (the engine keys prefix pages by it). Decoded-size
budgets from headers, the per-request budget, cancellation checks in the decode loops, and that
streaming / per-frame resizing decode the same samples and pixels as whole-array processing."""

import base64
import dataclasses
from functools import partial

import numpy as np
import pytest
import soxr
import torch
from helpers.media_samples import encode_audio, encode_image, encode_video, gradient_image, tone

from omniwalk.media.audio import decode_audio
from omniwalk.media.budget import DecodeTicket, check_decoded_size
from omniwalk.media.errors import DecodeCancelled, MediaLimitError
from omniwalk.media.image import decode_image
from omniwalk.media.limits import MediaLimits
from omniwalk.media.patches import VIDEO_PATCHES, resize_video
from omniwalk.media.preprocess import preprocess
from omniwalk.media.video import decode_video
from omniwalk.models.common.processing.chat import MediaPart
from omniwalk.models.family import ModelInfo
from omniwalk.models.qwen2_5_omni.processing import media_inputs as qwen2_5
from omniwalk.models.qwen3_omni import family as qwen3_family
from omniwalk.models.qwen3_omni.processing import media_inputs as qwen3
from omniwalk.serve.wire import Add, Ready, pack, unpack

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


def test_a_preprocessed_part_names_its_content_across_the_wire():
    """Each array part carries a digest of its content (bytes): equal for the same bytes, another for
    other audio or the same pixels at another size; it crosses the wire as bytes and the engine's
    ``MediaPart`` reads it, while a client's JSON (a string) is never taken for one."""
    wav = encode_audio(tone(1.0, 16000), 16000, "WAV")
    parts = [
        preprocess("audio", wav),
        preprocess("audio", wav),
        preprocess("audio", encode_audio(tone(1.1), 16000, "WAV")),
    ]
    image = encode_image(gradient_image(90, 130), "PNG")
    parts += [preprocess("image", image), preprocess("image", image, spec=qwen3_family.PATCH_SPECS["image"])]
    digests = [part["digest"] for part in parts]
    assert all(isinstance(d, bytes) and len(d) == 16 for d in digests)
    assert digests[0] == digests[1] and len(set(digests)) == 4
    (crossed,) = unpack(pack(Add({"part": parts[0]})))
    assert MediaPart("audio", crossed.request["part"]).digest == digests[0]
    assert MediaPart("audio", {"type": "input_audio", "digest": digests[0].hex()}).digest is None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_specs_cross_the_wire_whole(family):
    """The engine process sends its ``ModelInfo`` as a dict (``Ready``); the server's copy is equal."""
    info = ModelInfo("m", ("text", "audio"), ("a", "b"), 24000, {"x": "flag"}, ("x",), patch_specs=FAMILIES[family][1])
    received = ModelInfo.from_dict(unpack(pack(Ready(dataclasses.asdict(info))))[0].info)
    assert received == info  # (PatchSpec tuples included: a list would not compare equal)


class CancelAfter(DecodeTicket):
    """A ticket whose client hangs up after ``n`` checks (one per decoded frame or chunk)."""

    def __init__(self, n: int):
        super().__init__(2**40)
        self.num_checks, self.n = 0, n

    def check(self) -> None:
        self.num_checks += 1
        if self.num_checks > self.n:
            self.cancel()
        super().check()


def test_each_kind_is_refused_from_its_header_naming_the_limit():
    limits = MediaLimits(max_audio_decoded_bytes=1000, max_image_decoded_bytes=1000, max_video_decoded_bytes=1000)
    with pytest.raises(MediaLimitError, match="max_image_decoded_bytes = 1000"):
        check_decoded_size(1001, limits, "image")
    check_decoded_size(1000, limits, "image")
    with pytest.raises(MediaLimitError, match="max_audio_decoded_bytes"):  # 2 channels x 4 bytes x 1600 samples
        decode_audio(encode_audio(tone(0.1, 16000, 2), 16000, "WAV"), limits)
    with pytest.raises(MediaLimitError, match="max_image_decoded_bytes"):
        decode_image(encode_image(gradient_image(20, 20), "PNG"), limits)
    with pytest.raises(MediaLimitError, match="max_video_decoded_bytes"):
        decode_video(encode_video(np.zeros((4, 32, 32, 3), np.uint8), 4), limits)


def test_a_request_budget_sums_its_items():
    ticket = DecodeTicket(max_request_bytes=100)
    ticket.reserve(60)
    with pytest.raises(MediaLimitError, match="max_request_decoded_bytes = 100"):
        ticket.reserve(41)
    ticket.reserve(40)


def test_video_frames_are_resized_as_decoded_to_the_batched_resize():
    frames = np.stack([gradient_image(48, 80, seed=i) for i in range(8)])
    data = encode_video(frames, 4)
    whole = decode_video(data).frames
    expected = resize_video(torch.from_numpy(whole), VIDEO_PATCHES).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(decode_video(data, spec=VIDEO_PATCHES).frames, expected)


def test_audio_streamed_in_chunks_equals_the_whole_wave_resampled():
    wave = tone(9.0, 44100, 2)  # > 6 chunks of BLOCK_FRAMES
    got = decode_audio(encode_audio(wave, 44100, "WAV", "FLOAT"))
    np.testing.assert_array_equal(got, soxr.resample(wave.mean(axis=1), 44100, 16000, quality="HQ"))


@pytest.mark.parametrize("kind", ["video", "audio", "audio_pyav"])
def test_a_cancelled_ticket_stops_decoding_at_the_next_frame_or_chunk(kind):
    ticket = CancelAfter(3)
    with pytest.raises(DecodeCancelled):
        if kind == "video":
            decode_video(encode_video(np.zeros((40, 32, 32, 3), np.uint8), 4), ticket=ticket)
        elif kind == "audio":
            decode_audio(encode_audio(tone(10.0, 44100), 44100, "WAV"), ticket=ticket)
        else:
            decode_audio(encode_video(np.zeros((40, 32, 32, 3), np.uint8), 4, audio=tone(10.0)), ticket=ticket)
    assert ticket.num_checks == 4  # it stopped at the first check after the hang-up
