"""Decoded-size budgets from headers, the per-request budget, cancellation checks in the decode
loops, and that streaming / per-frame resizing decode the same samples and pixels as whole-array
processing."""

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
from omniwalk.media.video import decode_video


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
