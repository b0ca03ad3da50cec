"""The input audio buffer: PCM16 24 kHz samples appended by the client, until they become a turn.

Sample indices count everything appended in the session (``num_appended``); the buffer holds
``[start, num_appended)``. Without turn detection the client commits the whole buffer. With
server VAD (``detector``) the buffer is cut at the detector's boundaries: a turn is the audio
from ``prefix_padding_ms`` before the start of speech to ``end_padding_ms`` after its last voiced
frame; while nobody speaks only the padding's worth is kept, so an idle microphone does not grow
it. A tentative end carries the turn as a stop at that point would (the same samples), and leaves
it in the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omniwalk.serve.realtime.vad import FRAME_MS, INPUT_RATE, TurnDetector, VADParams


@dataclass(frozen=True)
class Speech:
    kind: str  # "start" (``sample``: where the turn's audio begins, padding included) | "tentative" | "resume" | "stop"
    sample: int
    audio: np.ndarray | None = None  # a stop's (or tentative end's) turn: int16 from the start (padding included)


def samples_to_ms(samples: int) -> int:
    return samples * 1000 // INPUT_RATE


class InputAudio:
    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.chunks: list[np.ndarray] = []
        self.start = 0  # the first buffered sample
        self.num_appended = 0
        self.detector: TurnDetector | None = None
        self.speech_start: int | None = None  # where the turn being spoken begins (padding included)

    @property
    def num_buffered(self) -> int:
        return self.num_appended - self.start

    def set_vad(self, params: VADParams | None) -> None:
        """Turn detection on (with these parameters) or off; speech in progress is forgotten."""
        self.detector = TurnDetector(params, self.num_appended) if params is not None else None
        self.speech_start = None

    def append(self, samples: np.ndarray) -> list[Speech]:
        """Buffer int16 samples; with VAD, return the starts and stops of speech they complete (a
        stop carries its turn's audio, which leaves the buffer). Raises ValueError when the buffer
        would exceed its limit (nothing is appended then)."""
        if self.num_buffered + len(samples) > self.max_samples:
            raise ValueError(
                f"the input audio buffer would hold more than {samples_to_ms(self.max_samples) / 1000:.0f} s; "
                "commit or clear it"
            )
        self.chunks.append(samples)
        self.num_appended += len(samples)
        if self.detector is None:
            return []
        out = []
        pad = self.detector.params.prefix_padding_ms * INPUT_RATE // 1000
        for b in self.detector.feed(samples):
            if b.kind == "start":
                self.speech_start = max(self.start, b.sample - pad)
                out.append(Speech("start", self.speech_start))
            elif b.kind == "tentative":
                out.append(Speech("tentative", b.sample, self.peek(b.sample)))
            elif b.kind == "resume":
                out.append(Speech("resume", b.sample))
            else:
                out.append(Speech("stop", b.sample, self.take(b.sample)))
        if self.speech_start is None:  # idle: keep what a start found in the next frames may reach back to
            lookback = (self.detector.params.window_ms + 2 * FRAME_MS) * INPUT_RATE // 1000
            self._drop_until(self.num_appended - pad - lookback)
        return out

    def take(self, end: int | None = None) -> np.ndarray:
        """The turn: samples from the start of speech (or of the buffer) to ``end`` (default: all);
        they leave the buffer, later samples stay."""
        end = self.num_appended if end is None else end
        begin = self.speech_start if self.speech_start is not None else self.start
        self._drop_until(begin)
        audio = np.concatenate(self.chunks) if self.chunks else np.empty(0, np.int16)
        turn, rest = audio[: end - begin], audio[end - begin :]
        self.chunks, self.start, self.speech_start = ([rest] if len(rest) else []), end, None
        return turn

    def peek(self, end: int) -> np.ndarray:
        """The samples ``take(end)`` would give, left in the buffer."""
        begin = self.speech_start if self.speech_start is not None else self.start
        audio = np.concatenate(self.chunks) if self.chunks else np.empty(0, np.int16)
        return audio[begin - self.start : end - self.start].copy()

    def clear(self) -> None:
        self.chunks, self.start = [], self.num_appended
        self.set_vad(self.detector.params if self.detector else None)

    def _drop_until(self, sample: int) -> None:
        """Forget buffered samples before ``sample``."""
        drop = min(max(sample - self.start, 0), self.num_buffered)
        if not drop:
            return
        audio = np.concatenate(self.chunks)[drop:]
        self.chunks, self.start = ([audio] if len(audio) else []), self.start + drop
