"""Server VAD: a stream of PCM16 24 kHz samples in, "speech started" / "speech stopped" out.

The per-frame decision is the WebRTC VAD (``webrtcvad-wheels``, a C library cheap enough to run
on the event loop, resampling and vote included; ``benchmarks/realtime/realtime_vad.py`` times
it). Audio is resampled to 16 kHz
(soxr's quick mode: the VAD itself works on the 0-4 kHz band, where that mode's aliasing does
not reach) and cut into 20 ms frames. Over the frames, a vote:

    frame       . . v v . v v v v . v v v . . . . . . . . . . . . . .
    vote        voiced share of the last window_ms >= threshold: speech (starts at the window's
                first voiced frame)
    stop        silence_ms since the last voiced frame that the vote counted as speech, and the
                vote below threshold: speech stops at the end of that quiet

(a lone voiced frame in noise, with the vote below threshold, does not restart the quiet).

``threshold`` is the protocol's (0-1): the share of voiced frames in the last ``window_ms`` that
counts as speech, so a higher one needs more continuous voice (it plays the role OpenAI gives to
"louder audio needed"). Sample indices count everything the session appended, at 24 kHz.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import soxr
import webrtcvad

INPUT_RATE = 24000  # the protocol's PCM16 rate
VAD_RATE = 16000
FRAME_MS = 20
FRAME_SAMPLES = INPUT_RATE * FRAME_MS // 1000  # 480 input samples per frame
_VAD_FRAME = VAD_RATE * FRAME_MS // 1000  # 320 resampled samples per frame
# The WebRTC VAD calls the first ~80 ms of a stream voiced whatever it holds (quiet noise at -54 to
# -30 dBFS included), while it adapts its noise model: those frames vote unvoiced.
WARMUP_FRAMES = 5


@dataclass(frozen=True)
class VADParams:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_ms: int = 500
    window_ms: int = 300
    aggressiveness: int = 3

    @property
    def votes_needed(self) -> int:
        window = self.window_ms // FRAME_MS
        return min(window, max(1, math.ceil(self.threshold * window - 1e-9)))


@dataclass(frozen=True)
class Boundary:
    kind: str  # "start" | "stop"
    sample: int  # at 24 kHz, from the session's first appended sample


class TurnDetector:
    def __init__(self, params: VADParams, first_sample: int = 0):
        self.params = params
        self.vad = webrtcvad.Vad(params.aggressiveness)
        self.resampler = soxr.ResampleStream(INPUT_RATE, VAD_RATE, 1, dtype="int16", quality="QQ")
        self.pending = np.empty(0, np.int16)  # resampled samples not yet in a frame
        self.first_frame_sample = first_sample  # frame i covers 24 kHz samples from here + 480 i
        self.num_frames = 0
        self.window: deque[bool] = deque([False] * (params.window_ms // FRAME_MS), maxlen=params.window_ms // FRAME_MS)
        self.is_speaking = False
        self.last_speech_frame = 0  # the last voiced frame while the vote said speech

    def feed(self, samples: np.ndarray) -> list[Boundary]:
        """The next int16 samples at 24 kHz -> the starts and stops they complete (in order)."""
        resampled = self.resampler.resample_chunk(samples)
        self.pending = np.concatenate([self.pending, resampled]) if len(self.pending) else resampled
        out = []
        num_whole = len(self.pending) // _VAD_FRAME
        for i in range(num_whole):
            frame = self.pending[i * _VAD_FRAME : (i + 1) * _VAD_FRAME]
            boundary = self._frame(self.vad.is_speech(frame.tobytes(), VAD_RATE))
            if boundary is not None:
                out.append(boundary)
        self.pending = self.pending[num_whole * _VAD_FRAME :]
        return out

    def _frame(self, is_voiced: bool) -> Boundary | None:
        is_voiced = is_voiced and self.num_frames >= WARMUP_FRAMES
        self.window.append(is_voiced)
        self.num_frames += 1
        is_speech = sum(self.window) >= self.params.votes_needed
        if not self.is_speaking:
            if not is_speech:
                return None
            self.is_speaking, self.last_speech_frame = True, self.num_frames
            first_voiced = next(i for i, v in enumerate(self.window) if v)
            start_frame = self.num_frames - len(self.window) + first_voiced
            return Boundary("start", self._sample(start_frame))
        if is_voiced and is_speech:
            self.last_speech_frame = self.num_frames
        if is_speech or (self.num_frames - self.last_speech_frame) * FRAME_MS < self.params.silence_ms:
            return None
        self.is_speaking = False
        return Boundary("stop", self._sample(self.num_frames))

    def _sample(self, frame: int) -> int:
        return self.first_frame_sample + max(frame, 0) * FRAME_SAMPLES
