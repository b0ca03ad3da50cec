"""Real encoded media made in memory for tests (soundfile, Pillow and PyAV codecs)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
from PIL import Image


def tone(seconds: float, rate: int = 16000, channels: int = 1, freq: float = 440.0) -> np.ndarray:
    """float32 [samples] (or [samples, channels]) sine with a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * np.random.default_rng(0).standard_normal(t.shape)
    wave = wave.astype(np.float32)
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def encode_audio(wave: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def gradient_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [H, W, 3]: smooth colour gradients plus noise (a photo-like test card)."""
    y, x = np.mgrid[0:height, 0:width]
    base = 127 + 60 * np.sin(x / max(width, 1) * 6.0)[..., None] + 60 * np.cos(y / max(height, 1) * 4.0)[..., None]
    noise = np.random.default_rng(seed).normal(0, 12, (height, width, 3))
    return np.clip(base + noise * np.array([1.0, 0.5, 0.2]), 0, 255).astype(np.uint8)


def encode_image(image: Image.Image | np.ndarray, fmt: str, **save_args) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save_args)
    return buf.getvalue()


def encode_video(
    frames: np.ndarray, fps: int, fmt: str = "mp4", codec: str = "libx264", audio: np.ndarray | None = None
) -> bytes:
    """uint8 [T, H, W, 3] (+ optional mono float32 audio at 16 kHz) -> encoded bytes."""
    import av  # (lazy: the device machine's image has no PyAV; tests that encode no video run there)

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        video = out.add_stream(codec, rate=fps)
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        sound = (
            out.add_stream("aac" if fmt == "mp4" else "libopus", rate=16000 if fmt == "mp4" else 48000)
            if audio is not None
            else None
        )
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        out.mux(video.encode())
        if sound is not None:
            _write_audio(out, sound, audio)
    return buf.getvalue()


def _write_audio(out, sound, wave: np.ndarray) -> None:
    import av

    rate = sound.codec_context.sample_rate
    if rate != 16000:
        wave = np.interp(np.arange(int(len(wave) * rate / 16000)) * 16000 / rate, np.arange(len(wave)), wave)
    frame = av.AudioFrame.from_ndarray(wave.astype(np.float32)[None], format="flt", layout="mono")
    frame.sample_rate = rate
    for packet in sound.encode(frame):
        out.mux(packet)
    out.mux(sound.encode())
