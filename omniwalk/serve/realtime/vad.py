"""Server VAD: a stream of PCM16 24 kHz samples in, "speech started" / "speech stopped" out.

The per-frame decision is the WebRTC VAD (``webrtcvad-wheels``, a C library cheap enough to run
on the event loop, resampling and vote included; ``benchmarks/realtime/realtime_vad.py`` times
it). Audio is resampled to 16 kHz
(soxr's quick mode: the VAD itself works on the 0-4 kHz band, where that mode's aliasing does
not reach) and cut into 20 ms frames. The WebRTC VAD keeps calling frames voiced for ~120 ms
after the voice ends (its hangover); a voiced frame counts only when it is also louder than the
noise (``GATE_DB`` over the mean level of the frames it called unvoiced), so the end of a turn is
measured from the last frame that holds voice, not from the end of the hangover. Over the
frames, a vote:

    frame       . . v v . v v v v . v v v . . . . . . . . . . . . . .
    vote        voiced share of the last window_ms >= threshold: speech (starts at the window's
                first voiced frame)
    stop        silence_ms since the last voiced frame that the vote counted as speech, and the
                vote below threshold: the turn's audio ends end_padding_ms after that frame
    tentative   (with tentative_ms) the same after a shorter silence: where the turn's audio would
                end if no voice came before the stop; "resume" when voice comes first

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
# soxr's stream holds back one output sample: fed whole 20 ms frames, it completes all but the last, which
# then waits for the next append (a client's 100 ms chunk: a turn's end decided a chunk late). Three input
# samples of silence ahead of the stream (0.125 ms) make up for it, so every appended frame is decided at once.
RESAMPLER_LEAD = 3
# The WebRTC VAD calls the first ~80 ms of a stream voiced whatever it holds (quiet noise at -54 to
# -30 dBFS included), while it adapts its noise model: those frames vote unvoiced.
WARMUP_FRAMES = 5
GATE_DB = 6.0  # a voiced frame must be this much louder than the noise (its hangover frames are not)
NOISE_RATE = 0.1  # the noise level follows the unvoiced frames' levels at this rate (an exponential mean)


@dataclass(frozen=True)
class VADParams:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_ms: int = 500
    window_ms: int = 300
    aggressiveness: int = 3
    end_padding_ms: int = 200  # audio a turn keeps after its last voiced frame (at most silence_ms)
    tentative_ms: int | None = None  # a silence this long is a tentative end (None: not reported)

    @property
    def votes_needed(self) -> int:
        window = self.window_ms // FRAME_MS
        return min(window, max(1, math.ceil(self.threshold * window - 1e-9)))

    @property
    def end_padding_frames(self) -> int:
        return min(self.end_padding_ms, self.silence_ms) // FRAME_MS

    @property
    def tentative_frames(self) -> int | None:
        """Frames of quiet before a tentative end: at least the end padding (the turn's audio must be
        there), and shorter than the silence that stops the turn (None: no tentative ends)."""
        if self.tentative_ms is None:
            return None
        frames = max(-(-self.tentative_ms // FRAME_MS), self.end_padding_frames)
        return frames if frames * FRAME_MS < self.silence_ms else None


@dataclass(frozen=True)
class Boundary:
    kind: str  # "start" | "tentative" | "resume" | "stop"
    sample: int  # at 24 kHz, from the session's first appended sample (tentative, stop: where the turn ends)


class TurnDetector:
    def __init__(self, params: VADParams, first_sample: int = 0):
        self.params = params
        self.vad = webrtcvad.Vad(params.aggressiveness)
        self.resampler = soxr.ResampleStream(INPUT_RATE, VAD_RATE, 1, dtype="int16", quality="QQ")
        # resampled samples not yet in a frame; the stream starts RESAMPLER_LEAD samples of silence early
        self.pending = self.resampler.resample_chunk(np.zeros(RESAMPLER_LEAD, np.int16))
        self.pending_input = np.empty(0, np.int16)  # input samples of the frames not yet decided (for their level)
        self.first_frame_sample = first_sample  # frame i covers 24 kHz samples from here + 480 i
        self.num_frames = 0
        self.window: deque[bool] = deque([False] * (params.window_ms // FRAME_MS), maxlen=params.window_ms // FRAME_MS)
        self.noise_db: float | None = None  # the mean level of the frames the WebRTC VAD called unvoiced
        self.is_speaking = False
        self.is_tentative = False  # a tentative end was reported in the quiet going on
        self.last_speech_frame = 0  # the end of the last voiced frame while the vote said speech

    def feed(self, samples: np.ndarray) -> list[Boundary]:
        """The next int16 samples at 24 kHz -> the boundaries they complete (in order)."""
        resampled = self.resampler.resample_chunk(samples)
        self.pending = np.concatenate([self.pending, resampled]) if len(self.pending) else resampled
        self.pending_input = np.concatenate([self.pending_input, samples])
        out = []
        num_whole = len(self.pending) // _VAD_FRAME
        for i in range(num_whole):
            frame = self.pending[i * _VAD_FRAME : (i + 1) * _VAD_FRAME]
            level = _level_db(self.pending_input[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
            boundary = self._frame(self._is_voiced(self.vad.is_speech(frame.tobytes(), VAD_RATE), level))
            if boundary is not None:
                out.append(boundary)
        self.pending = self.pending[num_whole * _VAD_FRAME :]
        self.pending_input = self.pending_input[num_whole * FRAME_SAMPLES :]
        return out

    def _is_voiced(self, is_voiced: bool, level_db: float) -> bool:
        """The WebRTC decision, less its warm-up and its hangover (voiced frames no louder than the noise)."""
        if self.num_frames < WARMUP_FRAMES:
            return False
        if not is_voiced:
            noise = level_db if self.noise_db is None else self.noise_db
            self.noise_db = noise + NOISE_RATE * (level_db - noise)
            return False
        return self.noise_db is None or level_db > self.noise_db + GATE_DB

    def _frame(self, is_voiced: bool) -> Boundary | None:
        self.window.append(is_voiced)
        self.num_frames += 1
        is_speech = sum(self.window) >= self.params.votes_needed
        if not self.is_speaking:
            if not is_speech:
                return None
            self.is_speaking, self.is_tentative, self.last_speech_frame = True, False, self.num_frames
            first_voiced = next(i for i, v in enumerate(self.window) if v)
            start_frame = self.num_frames - len(self.window) + first_voiced
            return Boundary("start", self._sample(start_frame))
        if is_voiced and is_speech:
            self.last_speech_frame = self.num_frames
            if self.is_tentative:
                self.is_tentative = False
                return Boundary("resume", self._sample(self.num_frames - 1))
        quiet_frames = self.num_frames - self.last_speech_frame
        turn_end = self._sample(self.last_speech_frame + self.params.end_padding_frames)
        if is_speech:
            return None
        if quiet_frames * FRAME_MS >= self.params.silence_ms:
            self.is_speaking = False
            return Boundary("stop", turn_end)
        tentative = self.params.tentative_frames
        if tentative is not None and not self.is_tentative and quiet_frames >= tentative:
            self.is_tentative = True
            return Boundary("tentative", turn_end)
        return None

    def _sample(self, frame: int) -> int:
        return self.first_frame_sample + max(frame, 0) * FRAME_SAMPLES


def _level_db(samples: np.ndarray) -> float:
    return 10 * math.log10(float(np.mean(samples.astype(np.float64) ** 2)) + 1.0)
