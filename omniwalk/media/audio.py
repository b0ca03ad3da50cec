"""Audio bytes or arrays -> mono float32 waveform at 16 kHz.

Decoders: libsndfile (through ``soundfile``; its wheel reads wav, flac, ogg/vorbis, ogg/opus and
mp3) first, PyAV (FFmpeg) for everything else (m4a/aac, webm, audio tracks of videos).
Channels are averaged; other rates are converted with soxr's high-quality resampler. Encoded audio
is decoded, downmixed and resampled as a stream of chunks (``Mono16k``), so only the 16 kHz mono
output is ever held whole; its header's samples x channels are checked against the budget first
(``budget.py``).
"""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import soxr

from omniwalk.errors import MediaError
from omniwalk.media.budget import AUDIO_BYTES_PER_SAMPLE, DecodeTicket, admit, check_decoded_size
from omniwalk.media.errors import CorruptMediaError, EmptyMediaError, MediaLimitError
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits

SAMPLE_RATE = 16000
BLOCK_FRAMES = 65536  # source frames per chunk read through libsndfile


def decode_audio(
    data: bytes | np.ndarray,
    limits: MediaLimits = DEFAULT_LIMITS,
    *,
    sample_rate: int = SAMPLE_RATE,
    ticket: DecodeTicket | None = None,
):
    """Encoded bytes, or a float array [samples] / [samples, channels] at ``sample_rate``, -> float32 [L] at 16 kHz."""
    if isinstance(data, np.ndarray):
        if data.ndim not in (1, 2) or not np.issubdtype(data.dtype, np.floating):
            raise CorruptMediaError(
                f"audio array must be float [samples] or [samples, channels], got {data.dtype} {data.shape}"
            )
        wave = data.astype(np.float32, copy=False)
        wave = wave.mean(axis=1) if wave.ndim == 2 else wave
        _check_duration(wave.shape[0] / sample_rate, limits)
        if sample_rate != SAMPLE_RATE:
            wave = soxr.resample(wave, sample_rate, SAMPLE_RATE, quality="HQ")
    else:
        if len(data) > limits.max_input_bytes:
            raise MediaLimitError(f"audio is {len(data)} bytes; the limit is {limits.max_input_bytes}")
        wave = _decode_soundfile(bytes(data), limits, ticket)
        wave = decode_audio_stream(bytes(data), limits, ticket) if wave is None else wave
        if wave is None:
            raise CorruptMediaError("could not decode audio (unknown format or corrupt data)")
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


class Mono16k:
    """Mono float32 chunks at ``rate`` -> one float32 wave at 16 kHz, resampled as a stream (soxr HQ,
    the same samples as resampling the whole wave at once). Each chunk checks the ticket and the
    running length, so a header that understates the length is caught while decoding."""

    def __init__(self, rate: int, channels: int, limits: MediaLimits, ticket: DecodeTicket | None):
        self.rate, self.channels, self.limits, self.ticket = rate, channels, limits, ticket
        self.num_samples = 0  # at the source rate
        self.pieces: list[np.ndarray] = []
        self.stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, "float32", "HQ")

    def push(self, mono: np.ndarray) -> None:
        if self.ticket is not None:
            self.ticket.check()
        self.num_samples += mono.shape[0]
        if self.num_samples > self.limits.max_audio_seconds * self.rate:
            raise MediaLimitError(f"audio is longer than {self.limits.max_audio_seconds} s")
        check_decoded_size(self.num_samples * self.channels * 4, self.limits, "audio")
        mono = np.asarray(mono, dtype=np.float32)
        self.pieces.append(mono.copy() if self.stream is None else self.stream.resample_chunk(mono))

    def finish(self) -> np.ndarray:
        _check_duration(self.num_samples / self.rate, self.limits)
        if self.stream is not None:
            self.pieces.append(self.stream.resample_chunk(np.zeros(0, np.float32), last=True))
        return np.concatenate(self.pieces)


def _decode_soundfile(data: bytes, limits: MediaLimits, ticket: DecodeTicket | None) -> np.ndarray | None:
    """Through libsndfile, chunk by chunk; None if it does not read this format."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.frames > 0:  # known up front: refuse before decoding
                _check_duration(f.frames / f.samplerate, limits)
                admit(f.frames * f.channels * AUDIO_BYTES_PER_SAMPLE, limits, "audio", ticket)
            out = Mono16k(f.samplerate, f.channels, limits, ticket)
            for block in f.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True):
                out.push(block.mean(axis=1))
            return out.finish()
    except sf.LibsndfileError:
        return None  # not a format libsndfile reads: try FFmpeg


def decode_audio_stream(data: bytes, limits: MediaLimits, ticket: DecodeTicket | None = None) -> np.ndarray | None:
    """First audio stream of a container (PyAV) as mono float32 at 16 kHz; None if there is none."""
    import av  # (lazy: PyAV is large; WAV, FLAC, Ogg and MP3 decode through libsndfile)

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            codec = stream.codec_context
            if stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
                _check_duration(seconds, limits)
                samples = int(seconds * codec.sample_rate * codec.channels)
                admit(samples * AUDIO_BYTES_PER_SAMPLE, limits, "audio", ticket)
            # NOTE: libswresample only downmixes to mono here; the rate change is soxr's (HQ).
            mono, out = av.AudioResampler(format="flt", layout="mono"), None
            for frame in container.decode(stream):
                out = out or Mono16k(frame.sample_rate, max(codec.channels, 1), limits, ticket)
                for piece in mono.resample(frame):
                    out.push(piece.to_ndarray().reshape(-1))
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, IndexError):
        raise CorruptMediaError("could not decode audio (corrupt data or an unsupported codec)") from None
    if out is None or out.num_samples == 0:
        raise EmptyMediaError("audio stream has no samples")
    return out.finish()
