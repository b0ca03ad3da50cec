"""User turns for the realtime benchmarks: real speech by ``espeak-ng``, with pauses inside a turn.

A turn is two phrases of a question joined by ``pause_s`` of microphone quiet: a pause longer than a
tentative end of speech and shorter than the confirming silence, where a preemptive server starts
an answer that it must then discard. The speech is espeak-ng's (22,050 Hz, resampled to the
protocol's 24 kHz, leading and trailing silence trimmed); where espeak-ng is not installed
(``apt-get install espeak-ng``) a synthetic voiced signal (``bench.workload.speech_like``) of the
same length stands in, and ``source`` says which one a run used.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from functools import cache

import numpy as np
import soxr

from omniwalk.bench.workload import speech_like

RATE = 24000  # the Realtime API's PCM16 rate
ESPEAK_WPM = 165  # conversational speaking rate, words per minute
QUIET_DBFS = -54.0  # the microphone's noise floor between phrases
# (first half, second half) of each question: a turn says both, with a pause between
PHRASES = [
    ("what is the weather like", "in paris tomorrow morning"),
    ("can you tell me", "a short story about a cat"),
    ("how far is the moon", "from the earth in kilometers"),
    ("please remind me", "to call my sister at six"),
    ("which train goes", "to the airport after nine"),
    ("what should I cook", "for dinner with rice and beans"),
    ("how do I say thank you", "in japanese and in french"),
    ("is it going to rain", "during the football game tonight"),
]


def source() -> str:
    """The speech source a run uses: "espeak-ng" where installed, else "synthetic"."""
    return "espeak-ng" if shutil.which("espeak-ng") else "synthetic"


@cache
def spoken(text: str, voice: str = "en-us") -> np.ndarray:
    """``text`` said by espeak-ng -> float32 samples at 24 kHz, silence trimmed (a synthetic stand-in
    of espeak's length for the text, ~0.25 s per word, where espeak-ng is missing)."""
    if source() == "synthetic":
        return speech_like(0.25 * len(text.split()), len(text), RATE)
    done = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(ESPEAK_WPM), "--stdout", text], capture_output=True, check=True
    )
    with wave.open(io.BytesIO(done.stdout)) as w:
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    voiced = np.flatnonzero(np.abs(samples) > 0.02)
    samples = samples[voiced[0] : voiced[-1] + 1] if len(voiced) else samples
    return soxr.resample(samples, rate, RATE).astype(np.float32)


def quiet(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Microphone noise at ``QUIET_DBFS``."""
    return (10 ** (QUIET_DBFS / 20) * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


def turn(index: int, pause_s: float, rng: np.random.Generator) -> np.ndarray:
    """Turn ``index``: its question's first half, ``pause_s`` of quiet, the second half (float32, 24 kHz)."""
    first, second = PHRASES[index % len(PHRASES)]
    parts = [spoken(first)] + ([quiet(pause_s, rng)] if pause_s > 0 else []) + [spoken(second)]
    return np.concatenate(parts)
