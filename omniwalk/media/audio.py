"""Audio bytes or arrays -> mono float32 waveform at 16 kHz.

Decoders: libsndfile (through ``soundfile``; its wheel reads wav, flac, ogg/vorbis, ogg/opus and
mp3) first, PyAV (FFmpeg) for everything else (m4a/aac, webm, audio tracks of videos).
Channels are averaged; other rates are converted with soxr's high-quality resampler.
"""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import soxr

from omniwalk.errors import MediaError
from omniwalk.media.errors import CorruptMediaError, EmptyMediaError, MediaLimitError
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits

SAMPLE_RATE = 16000


def decode_audio(data: bytes | np.ndarray, limits: MediaLimits = DEFAULT_LIMITS, *, sample_rate: int = SAMPLE_RATE):
    """Encoded bytes, or a float array [samples] / [samples, channels] at ``sample_rate``, -> float32 [L] at 16 kHz."""
    if isinstance(data, np.ndarray):
        if data.ndim not in (1, 2) or not np.issubdtype(data.dtype, np.floating):
            raise CorruptMediaError(
                f"audio array must be float [samples] or [samples, channels], got {data.dtype} {data.shape}"
            )
        wave, rate = data.astype(np.float32, copy=False), sample_rate
    else:
        if len(data) > limits.max_input_bytes:
            raise MediaLimitError(f"audio is {len(data)} bytes; the limit is {limits.max_input_bytes}")
        wave, rate = _decode_bytes(bytes(data), limits)
    wave = wave.mean(axis=1) if wave.ndim == 2 else wave
    _check_duration(wave.shape[0] / rate, limits)
    if rate != SAMPLE_RATE:
        wave = soxr.resample(wave, rate, SAMPLE_RATE, quality="HQ")
    if not np.isfinite(wave).all():
        raise CorruptMediaError("audio contains NaN or infinite samples")
    return np.ascontiguousarray(wave, dtype=np.float32)


def _check_duration(seconds: float, limits: MediaLimits) -> None:
    if seconds <= 0:
        raise EmptyMediaError("audio has no samples")
    if seconds < limits.min_audio_seconds:
        raise EmptyMediaError(f"audio is {seconds:.3f} s long; at least {limits.min_audio_seconds} s is needed")
    if seconds > limits.max_audio_seconds:
        raise MediaLimitError(f"audio is {seconds:.1f} s long; the limit is {limits.max_audio_seconds} s")


def _decode_bytes(data: bytes, limits: MediaLimits) -> tuple[np.ndarray, int]:
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.frames > 0:  # known up front: refuse before decoding
                _check_duration(f.frames / f.samplerate, limits)
            return f.read(dtype="float32", always_2d=True), f.samplerate
    except sf.LibsndfileError:
        pass  # not a format libsndfile reads: try FFmpeg
    wave = decode_audio_stream(data, limits)
    if wave is None:
        raise CorruptMediaError("could not decode audio (unknown format or corrupt data)")
    return wave, SAMPLE_RATE


def decode_audio_stream(data: bytes, limits: MediaLimits) -> np.ndarray | None:
    """First audio stream of a container (PyAV) as mono float32 at 16 kHz; None if there is none."""
    import av  # (lazy: PyAV is large; WAV, FLAC, Ogg and MP3 decode through libsndfile)

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            if stream.duration is not None and stream.time_base is not None:
                _check_duration(float(stream.duration * stream.time_base), limits)
            # NOTE: libswresample only downmixes to mono here; the rate change is soxr's (HQ).
            mono = av.AudioResampler(format="flt", layout="mono")
            pieces, rate, max_samples = [], None, None
            for frame in container.decode(stream):
                rate = rate or frame.sample_rate
                max_samples = max_samples or int(limits.max_audio_seconds * rate) + 1
                pieces += [f.to_ndarray().reshape(-1) for f in mono.resample(frame)]
                if sum(p.shape[0] for p in pieces) > max_samples:
                    raise MediaLimitError(f"audio is longer than {limits.max_audio_seconds} s")
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, IndexError):
        raise CorruptMediaError("could not decode audio (corrupt data or an unsupported codec)") from None
    if not pieces:
        raise EmptyMediaError("audio stream has no samples")
    wave = np.concatenate(pieces)
    _check_duration(wave.shape[0] / rate, limits)
    return soxr.resample(wave, rate, SAMPLE_RATE, quality="HQ") if rate != SAMPLE_RATE else wave
