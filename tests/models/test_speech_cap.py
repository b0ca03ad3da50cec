"""Speech as long as its text (``config.SpeechCap``): a talker whose end code never comes (random
weights) stops near its answer's length, in both families; where the cap does not bind, speech is
exactly what it was without one."""

import dataclasses

from helpers import qwen2_5_omni, qwen3_omni

from omniwalk.config import ModelConfig, SpeechCap
from omniwalk.models.qwen2_5_omni.programs.talker_program import CODES_PER_S
from omniwalk.models.qwen3_omni.programs.talker_program import FRAMES_PER_S

TEXT_TOKENS = 8
NO_CAP = SpeechCap(s_per_text_token=0.0)


def chat(**extra) -> dict:
    """Exactly TEXT_TOKENS of text (no end of turn to speak or not), greedy speech."""
    return {
        "messages": qwen3_omni.MESSAGES,
        "modalities": ["text", "audio"],
        "max_tokens": TEXT_TOKENS,
        "min_tokens": TEXT_TOKENS,
        "temperature": 0.0,
        "talker_temperature": 0.0,
        "code_predictor_temperature": 0.0,
        **extra,
    }


def capped(omni, cap: SpeechCap):
    """``omni`` with its talker's speech cap set to ``cap`` (returns the one it had)."""
    program = omni.engine.stages["talker"].program
    before, program.speech_cap = program.speech_cap, cap
    return before


def test_the_default_cap_is_the_configs():
    assert dataclasses.asdict(ModelConfig("x").speech_cap) == dataclasses.asdict(SpeechCap())
    assert SpeechCap().max_frames(TEXT_TOKENS, FRAMES_PER_S) == 125  # (8 x 1.0 s + 2.0 s) x 12.5 Hz
    assert NO_CAP.max_frames(TEXT_TOKENS, FRAMES_PER_S) is None


def test_qwen3_speech_stops_near_its_text():
    """Random weights never draw codec EOS: without the cap this request speaks 4,096 frames."""
    omni = qwen3_omni.omni()
    assert omni.engine.stages["talker"].program.speech_cap == SpeechCap()
    out = omni.generate(chat())
    cap = SpeechCap().max_frames(len(out.token_ids), FRAMES_PER_S)
    assert len(out.token_ids) == TEXT_TOKENS
    assert 0 < out.codes.shape[0] <= cap
    assert out.audio.shape[0] <= cap * 1920


def test_qwen3_speech_under_the_cap_is_unchanged():
    omni = qwen3_omni.omni()
    request = chat(max_audio_frames=24)
    out = omni.generate(request)
    before = capped(omni, NO_CAP)
    try:
        uncapped = omni.generate(request)
    finally:
        capped(omni, before)
    assert out.codes.shape[0] == 24
    assert out.token_ids == uncapped.token_ids
    assert (out.codes == uncapped.codes).all()


def test_qwen3_min_audio_frames_raises_the_cap():
    omni, cap = qwen3_omni.omni(), SpeechCap(s_per_text_token=0.05, margin_s=0.1)
    limit = cap.max_frames(TEXT_TOKENS, FRAMES_PER_S)
    before = capped(omni, cap)
    try:
        assert omni.generate(chat()).codes.shape[0] == limit == 7
        assert omni.generate(chat(min_audio_frames=12)).codes.shape[0] == 12
    finally:
        capped(omni, before)


def test_qwen3_speech_over_the_cap_when_the_text_ends_stops_there():
    """A cap of 1 frame for the 8 tokens: the talker has drawn more by the time the text ends (about one
    frame per text token while it streams); it stops at once instead of waiting for a frame."""
    omni, cap = qwen3_omni.omni(), SpeechCap(s_per_text_token=0.01, margin_s=0.0)
    before = capped(omni, cap)
    try:
        frames = omni.generate(chat()).codes.shape[0]
    finally:
        capped(omni, before)
    assert cap.max_frames(TEXT_TOKENS, FRAMES_PER_S) == 1 and 1 <= frames < TEXT_TOKENS


def test_qwen2_5_speech_stops_near_its_text():
    """A tighter cap than the default's 500 codes (10 s at 50 Hz), for a short token2wav on the CPU."""
    omni, cap = qwen2_5_omni.omni(), SpeechCap(s_per_text_token=0.1, margin_s=0.2)
    before = capped(omni, cap)
    try:
        out = omni.generate(chat(token2wav_num_steps=2))
    finally:
        capped(omni, before)
    assert len(out.token_ids) == TEXT_TOKENS
    assert 0 < len(out.codes) <= cap.max_frames(TEXT_TOKENS, CODES_PER_S) == 50


def test_qwen2_5_speech_under_the_cap_is_unchanged():
    omni = qwen2_5_omni.omni()
    request = chat(max_audio_frames=20, token2wav_num_steps=2)
    out = omni.generate(request)
    before = capped(omni, NO_CAP)
    try:
        uncapped = omni.generate(request)
    finally:
        capped(omni, before)
    assert out.token_ids == uncapped.token_ids and out.codes == uncapped.codes
