"""``Omni`` speech output end to end vs HF ``generate`` (thinker + talker + code predictor + Code2Wav)."""

from functools import cache

import pytest
import torch
from helpers.qwen3_omni import FRAMES, MESSAGES, REQUESTS, TEXT_TOKENS, checkpoint, greedy_speech, hf_inputs, omni

from omniwalk.errors import InvalidRequestError

pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")


@cache
def hf(name: str):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint(name)).eval()
    model.config.talker_config.audio_config = model.config.thinker_config.audio_config  # HF bug, reference §9.6
    return model


@torch.no_grad()
def run_hf(name: str, inputs: dict, voice: str):
    """HF greedy speech -> (generated ids, codes [F, G], waveform)."""
    model, captured = hf(name), {}
    decode = model.code2wav.chunked_decode

    def keep(codes, **kwargs):
        captured["codes"] = codes[0].T.clone()
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = keep
    try:
        seq, wav = model.generate(
            **inputs,
            speaker=voice,
            thinker_max_new_tokens=TEXT_TOKENS,
            thinker_min_new_tokens=TEXT_TOKENS,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=FRAMES + 1,  # the last group-0 code never gets its residual codes
            talker_min_new_tokens=FRAMES + 1,
        )
    finally:
        del model.code2wav.chunked_decode
    return seq[0, inputs["input_ids"].shape[1] :].tolist(), captured["codes"], wav.reshape(-1)


SPEECH_CASES = [
    ("text", "Chelsie"),
    ("audio_image", "Chelsie"),
    ("image", "ethan"),
    ("audio", "AIDEN"),
    ("video", "chelsie"),
    ("multi_turn", "Ethan"),
    ("image_audio_image", "aiden"),
]


@pytest.mark.parametrize("case, voice", SPEECH_CASES)
@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_speech_matches_hf_generate(name, case, voice):
    messages = MESSAGES if case == "text" else REQUESTS[case]["messages"]
    request = greedy_speech(messages, voice=voice)
    out = omni(name).generate(request)
    prompt = omni(name).family.prompt(request)
    ids, codes, wav = run_hf(name, hf_inputs(prompt, False), voice)
    assert out.token_ids == ids
    assert out.codes.shape == (FRAMES, omni(name).family.cfg.talker.num_code_groups)
    assert torch.equal(out.codes, codes)
    assert out.audio.shape == wav.shape == (1920 * FRAMES - 555,)
    assert (out.audio - wav).abs().max() <= 1e-4


def test_voices_differ_and_do_not_leak_between_requests():
    # Sampled (seeded) talker: with random tiny weights greedy codes barely depend on the voice.
    sampled = {"talker_temperature": 0.9, "code_predictor_temperature": 1.0, "seed": 3}
    requests = [greedy_speech(MESSAGES, voice=v, **sampled) for v in ("ethan", "aiden", "ethan")]
    outs = omni().generate(requests)
    alone = omni().generate(requests[1])
    assert torch.equal(outs[0].codes, outs[2].codes)
    assert not torch.equal(outs[0].codes, outs[1].codes)
    assert torch.equal(outs[1].codes, alone.codes)


def test_text_only_requests_return_no_audio():
    out = omni().generate({"messages": MESSAGES, "max_tokens": 3})
    assert out.audio is None and out.codes is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"voice": "nobody"}, "unknown voice 'nobody'.*aiden, chelsie, ethan"),
        ({"modalities": ["audio"]}, "modalities must be"),
        ({"modalities": ["text", "video"]}, "modalities must be"),
        ({"talker_temperature": -1.0}, "temperature"),
        ({"min_audio_frames": 9, "max_audio_frames": 3}, "audio_frames"),
    ],
)
def test_bad_speech_requests_are_typed_errors(fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        omni().generate({**greedy_speech(MESSAGES), **fields})


def test_codec_eos_stops_after_min_audio_frames():
    """A codec head that always prefers EOS: EOS is masked for min_audio_frames frames, then stops."""
    o = omni()
    talker = o.family.parts["talker"]
    eos, original = o.family.cfg.talker.codec.eos, talker.group0_logits
    talker.group0_logits = lambda h: original(h).index_fill(-1, torch.tensor([eos]), 1e4)
    try:
        three = o.generate({**greedy_speech(MESSAGES), "min_audio_frames": 3, "max_audio_frames": 10})
        none = o.generate({**greedy_speech(MESSAGES), "min_audio_frames": 0, "max_audio_frames": 10})
    finally:
        del talker.group0_logits
    groups = o.family.cfg.talker.num_code_groups
    assert three.codes.shape == (3, groups) and three.audio.shape == (1920 * 3 - 555,)
    assert none.codes.shape == (0, groups) and none.audio.numel() == 0 and none.finish_reason == "length"


def test_speech_sampling_is_seeded_per_request_and_never_emits_control_codes():
    def codes(seed):
        request = {**greedy_speech(MESSAGES, voice="chelsie"), "min_audio_frames": 6, "max_audio_frames": 6}
        request.update(talker_temperature=0.9, code_predictor_temperature=1.0, seed=seed)
        return omni().generate(request).codes

    first, again, other = codes(1), codes(1), codes(2)
    cfg = omni().family.cfg.talker
    assert first.shape == (6, cfg.num_code_groups)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert int(first[:, 0].max()) < cfg.text.vocab_size - 1024  # control codes are suppressed
    assert int(first[:, 1:].max()) < cfg.code_predictor.vocab_size
