"""Audio decoding (real codecs, typed errors) and log-mel parity with HF's WhisperFeatureExtractor."""

import numpy as np
import pytest
import torch
from helpers.hf_oracle import whisper_extractor
from helpers.media_samples import encode_audio, tone

from omniwalk.media.audio import decode_audio
from omniwalk.media.errors import CorruptMediaError, EmptyMediaError, MediaLimitError
from omniwalk.media.limits import MediaLimits
from omniwalk.media.mel import log_mel, mel_filter_bank


@pytest.fixture(scope="module")
def extractor():
    return whisper_extractor()


def _hf(extractor, waves):
    """Called as the Qwen3-Omni processor calls it."""
    out = extractor(
        waves, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt"
    )
    return out["input_features"], out["attention_mask"].sum(-1)


def _speechlike(num_samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    envelope = np.abs(np.sin(np.arange(num_samples) / 1600.0))
    return (0.2 * rng.standard_normal(num_samples) * envelope).astype(np.float32)


def test_mel_filter_bank_matches_hf(extractor):
    np.testing.assert_allclose(mel_filter_bank(), extractor.mel_filters, rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_samples", [1600, 16000, 16159, 16160, 80000 + 37, 720000])  # 0.1 s .. 45 s
def test_single_clip_matches_hf(extractor, num_samples):
    wave = _speechlike(num_samples, num_samples)
    ref, ref_frames = _hf(extractor, [wave])
    feats, frames = log_mel([torch.from_numpy(wave)])
    assert frames.tolist() == ref_frames.tolist() == [num_samples // 160]
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=0)


def test_padded_batch_matches_hf_including_ceil_frame_rule(extractor):
    lengths = [16000, 8100, 1600, 16159, 48037]
    waves = [_speechlike(n, i) for i, n in enumerate(lengths)]
    ref, ref_frames = _hf(extractor, waves)
    feats, frames = log_mel([torch.from_numpy(w) for w in waves], pad_together=True)
    # shorter clips get ceil(l / 160) frames, the longest floor(L / 160)
    assert frames.tolist() == ref_frames.tolist() == [100, 51, 10, 101, 300]
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=0)


def test_serving_batch_equals_each_clip_alone(extractor):
    lengths = [16159, 1600, 40000]
    waves = [_speechlike(n, i) for i, n in enumerate(lengths)]
    feats, frames = log_mel([torch.from_numpy(w) for w in waves])
    assert frames.tolist() == [n // 160 for n in lengths]
    for wave, f, n in zip(waves, feats, frames.tolist(), strict=True):
        ref, _ = _hf(extractor, [wave])
        torch.testing.assert_close(f[:, :n], ref[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "fmt,subtype,rate",
    [
        ("WAV", None, 44100),
        ("FLAC", None, 22050),
        ("OGG", "VORBIS", 44100),
        ("OGG", "OPUS", 48000),
        ("MP3", None, 44100),
    ],
)
def test_decodes_codecs_to_16k_mono(fmt, subtype, rate):
    wave = tone(1.5, rate, channels=2)
    out = decode_audio(encode_audio(wave, rate, fmt, subtype))
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.shape[0] - 24000) < 2000  # codec priming/padding may add a few ms
    expected = tone(1.5, 16000)
    lag = int(np.argmax(np.correlate(out[:8000], expected[:4000], mode="valid")))
    corr = np.corrcoef(out[lag : lag + 16000], expected[:16000])[0, 1]
    assert corr > (0.995 if fmt in ("WAV", "FLAC") else 0.95)  # the test noise differs per rate


def test_resampling_is_high_quality():
    out = decode_audio(encode_audio(tone(1.0, 44100), 44100, "WAV"))
    expected = tone(1.0, 16000)
    # noise differs per rate; the 440 Hz sine dominates and must survive resampling exactly
    assert np.corrcoef(out[100:-100], expected[100:-100])[0, 1] > 0.998


def test_accepts_arrays_and_resamples_them():
    assert decode_audio(tone(1.0)).shape == (16000,)
    assert decode_audio(tone(1.0, 8000, channels=2), sample_rate=8000).shape == (16000,)


@pytest.mark.parametrize(
    "data,limits,error",
    [
        (b"not audio at all" * 10, MediaLimits(), CorruptMediaError),
        (encode_audio(tone(1.0), 16000, "WAV")[:60], MediaLimits(), (CorruptMediaError, EmptyMediaError)),
        (encode_audio(np.zeros(0, np.float32), 16000, "WAV"), MediaLimits(), EmptyMediaError),
        (encode_audio(tone(0.01), 16000, "WAV"), MediaLimits(), EmptyMediaError),
        (encode_audio(tone(3.0), 16000, "FLAC"), MediaLimits(max_audio_seconds=2.0), MediaLimitError),
        (encode_audio(tone(1.0), 16000, "WAV"), MediaLimits(max_input_bytes=1000), MediaLimitError),
        (np.full(16000, np.nan, np.float32), MediaLimits(), CorruptMediaError),
        (np.zeros((16000, 2, 2), np.float32), MediaLimits(), CorruptMediaError),
        (np.zeros(16000, np.int16), MediaLimits(), CorruptMediaError),
    ],
    ids=["garbage", "truncated", "empty", "too-short", "too-long", "too-many-bytes", "nan", "bad-shape", "int-array"],
)
def test_bad_audio_raises_typed_error(data, limits, error):
    with pytest.raises(error):
        decode_audio(data, limits)
