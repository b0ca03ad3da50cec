"""Float PCM (mono, the model's sample rate, [-1, 1]) -> the response audio formats of the OpenAI audio API.

Streaming chunks are always raw PCM16 little-endian (``delta.audio.data``); whole responses use
the requested container. Encoding goes through libsndfile (the ``soundfile`` wheel ships it with
FLAC, MP3 and Ogg/Opus support). Opus only takes 8/12/16/24/48 kHz (24 kHz speech is kept as is).
"""

from __future__ import annotations

import io

import numpy as np

# format name -> (libsndfile container, subtype, MIME type)
FORMATS = {
    "wav": ("WAV", "PCM_16", "audio/wav"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
    "pcm16": (None, None, "audio/pcm"),
}
# OpenAI's /v1/audio/speech calls raw PCM "pcm"; chat completions call it "pcm16".
ALIASES = {"pcm": "pcm16"}


def normalize_format(name: str) -> str:
    """Canonical format name, or ValueError naming the supported ones."""
    canonical = ALIASES.get(name, name)
    if canonical not in FORMATS:
        raise ValueError(f"unsupported audio format {name!r}; supported: {', '.join(sorted(FORMATS))}")
    return canonical


def pcm16_bytes(samples: np.ndarray) -> bytes:
    """float [-1, 1] -> int16 little-endian bytes (values clipped, then scaled by 32767)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def encode_audio(samples: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    fmt = normalize_format(fmt)
    if fmt == "pcm16":
        return pcm16_bytes(samples)
    import soundfile

    container, subtype, _ = FORMATS[fmt]
    buf = io.BytesIO()
    soundfile.write(buf, np.clip(samples, -1.0, 1.0).astype(np.float32), sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


def mime_type(fmt: str) -> str:
    return FORMATS[normalize_format(fmt)][2]
