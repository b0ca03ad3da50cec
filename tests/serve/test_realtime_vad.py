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
    assert e1 == 2500 * MS + 200 * MS  # the last voiced frame, plus 200 ms of end padding
    assert s2 == 3500 * MS - 300 * MS
    assert e2 == 4500 * MS + 200 * MS
    np.testing.assert_array_equal(turn1, STREAM[s1:e1])  # a turn is the stream's samples, exactly
    np.testing.assert_array_equal(turn2, STREAM[s2:e2])
    if chunk != 480:
        assert [(k, s) for k, s, _ in events] == [(k, s) for k, s, _ in run(STREAM, 480)]


def test_threshold_silence_and_padding_are_honoured():
    strict = run(STREAM, 960, VADParams(threshold=1.0, silence_ms=200, prefix_padding_ms=0))
    (_, s1, _), (_, e1, _) = strict[:2]
    assert s1 == 1000 * MS  # no padding; the first frame of an all-voiced window
    assert e1 == 2500 * MS + 200 * MS
    # quiet passes no threshold; the WebRTC VAD's hangover (frames called voiced after the voice,
    # as quiet as the noise) is not voice, so at the default threshold (8 of 15 frames) 140 ms of
    # voice is a click, 160 ms speech
    assert run(quiet(3.0), 960, VADParams(threshold=0.2)) == []
    for ms, num_turns in ((60, 0), (140, 0), (160, 1)):
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


def confirmed(stream: np.ndarray, params: VADParams) -> list[tuple[str, int, int]]:
    """(kind, sample, where the stream was when it was reported), fed 20 ms at a time."""
    buffer = InputAudio(INPUT_RATE * 60)
    buffer.set_vad(params)
    return [
        (s.kind, s.sample, i + FRAME)
        for i in range(0, len(stream), FRAME)
        for s in buffer.append(stream[i : i + FRAME])
    ]


FRAME = 20 * MS
# (each 20 ms frame is decided as it arrives: the resampler's held-back sample is made up for, RESAMPLER_LEAD)


@pytest.mark.parametrize("silence_ms", [100, 240, 500, 960])
def test_a_turn_is_confirmed_its_silence_after_the_last_voiced_frame(silence_ms):
    """Not after the WebRTC VAD's hangover (~120 ms of quiet frames it still calls voiced)."""
    events = confirmed(STREAM[: 3500 * MS], VADParams(silence_ms=silence_ms, tentative_ms=None))
    assert [kind for kind, _, _ in events] == ["start", "stop"]
    end = 2500 * MS  # the last voiced sample
    assert events[1][1] == end + min(200, silence_ms) * MS  # the turn keeps 200 ms after it (at most its silence)
    vote_falls = end + (300 - 7 * 20) * MS  # 7 voiced frames of 15 in the window: fewer than the 8 needed
    assert events[1][2] == max(end + silence_ms * MS, vote_falls)


# speech 1000-2000 ms, a 300 ms pause, speech 2300-2800 (one turn); quiet to 3800
PAUSED = np.concatenate([quiet(1.0), speech(1.0), quiet(0.3, 1), speech(0.5, 2), quiet(1.0, 2)])


def test_tentative_ends_carry_the_turn_a_stop_would_and_resume_on_voice():
    params = VADParams(tentative_ms=200)
    events = confirmed(PAUSED, params)
    assert [(k, s) for k, s, _ in events] == [
        ("start", 700 * MS),
        ("tentative", 2200 * MS),  # the pause's tentative end: 200 ms after the voice, reported then
        ("resume", 2440 * MS),  # the frame where the vote counts the voice again
        ("tentative", 3000 * MS),
        ("stop", 3000 * MS),
    ]
    assert [at for _, _, at in events][1:] == [2200 * MS, 2460 * MS, 3000 * MS, 3300 * MS]
    turns = run(PAUSED, 960, params)
    tentative, stop = turns[3], turns[4]
    np.testing.assert_array_equal(tentative[2], stop[2])  # the same samples: a turn prepared early is the turn
    np.testing.assert_array_equal(stop[2], PAUSED[700 * MS : 3000 * MS])
    assert VADParams(tentative_ms=500).tentative_frames is None  # not shorter than the silence: none
    assert VADParams(tentative_ms=100).tentative_frames == 10  # at least the end padding (the turn's audio)
