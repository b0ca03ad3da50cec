"""The realtime server VAD and input buffer on synthesised streams (no server): where turns start
and stop, what audio a turn holds, and that none of it depends on how the stream was chunked."""

import numpy as np
import pytest

from omniwalk.bench.workload import speech_like
from omniwalk.serve.realtime.input_audio import InputAudio
from omniwalk.serve.realtime.vad import INPUT_RATE, VADParams

MS = INPUT_RATE // 1000


def pcm(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


def quiet(seconds: float, seed: int = 0) -> np.ndarray:
    return pcm(0.002 * np.random.default_rng(seed).standard_normal(int(seconds * INPUT_RATE)))


def speech(seconds: float, seed: int = 1) -> np.ndarray:
    return pcm(speech_like(seconds, seed, INPUT_RATE))


# quiet 0-1000 ms, speech 1000-2500, quiet 2500-3500, speech 3500-4500, quiet 4500-5300
STREAM = np.concatenate([quiet(1.0), speech(1.5), quiet(1.0, 1), speech(1.0, 2), quiet(0.8, 2)])


def run(stream: np.ndarray, chunk: int, params: VADParams | None = None) -> list[tuple]:
    buffer = InputAudio(INPUT_RATE * 60)
    buffer.set_vad(params or VADParams())
    events = []
    for i in range(0, len(stream), chunk):
        for s in buffer.append(stream[i : i + chunk]):
            events.append((s.kind, s.sample, None if s.audio is None else s.audio.copy()))
    return events


@pytest.mark.parametrize("chunk", [480, 2400, 7 * 331, len(STREAM)])
def test_turns_start_and_stop_where_the_speech_does_whatever_the_chunks(chunk):
    events = run(STREAM, chunk)
    assert [e[0] for e in events] == ["start", "stop", "start", "stop"]
    (_, s1, _), (_, e1, turn1), (_, s2, _), (_, e2, turn2) = events
    assert s1 == 1000 * MS - 300 * MS  # the first voiced frame, less 300 ms of padding
    assert 2500 * MS + 500 * MS <= e1 <= 2500 * MS + 500 * MS + 200 * MS  # 500 ms of quiet (+ the VAD's hangover)
    assert s2 == 3500 * MS - 300 * MS
    assert 4500 * MS + 500 * MS <= e2 <= 4500 * MS + 700 * MS
    np.testing.assert_array_equal(turn1, STREAM[s1:e1])  # a turn is the stream's samples, exactly
    np.testing.assert_array_equal(turn2, STREAM[s2:e2])
    if chunk != 480:
        assert [(k, s) for k, s, _ in events] == [(k, s) for k, s, _ in run(STREAM, 480)]


def test_threshold_silence_and_padding_are_honoured():
    strict = run(STREAM, 960, VADParams(threshold=1.0, silence_ms=200, prefix_padding_ms=0))
    (_, s1, _), (_, e1, _) = strict[:2]
    assert 1000 * MS <= s1 <= 1000 * MS + 40 * MS  # no padding; the first frame of an all-voiced window
    assert 2500 * MS + 200 * MS <= e1 <= 2500 * MS + 400 * MS
    # quiet passes no threshold; the WebRTC VAD holds a voiced decision ~80 ms after the voice
    # ends, so at the default threshold (8 of 15 frames) 60 ms of voice is a click, 100 ms speech
    assert run(quiet(3.0), 960, VADParams(threshold=0.2)) == []
    for ms, num_turns in ((60, 0), (100, 1)):
        burst = np.concatenate([quiet(1.0), speech(ms / 1000), quiet(1.0, 1)])
        assert len(run(burst, 960)) == 2 * num_turns


def test_an_idle_microphone_does_not_grow_the_buffer():
    buffer = InputAudio(INPUT_RATE * 2)  # a 2 s limit, fed 10 s of quiet
    buffer.set_vad(VADParams())
    for i in range(0, 10 * INPUT_RATE, 2400):
        assert buffer.append(quiet(0.1, i)) == []
    params = VADParams()
    assert buffer.num_buffered <= (params.prefix_padding_ms + params.window_ms + 40 + 100) * MS
    with pytest.raises(ValueError, match="commit or clear"):  # without VAD the limit holds
        buffer.set_vad(None)
        buffer.append(quiet(2.0))
