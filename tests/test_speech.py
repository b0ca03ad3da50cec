"""The offline speech hook: thinker outputs -> codes + waveform, limits, sampling and voices."""

import pytest
import torch
from test_talker import NUM_FRAMES, _case, oracle, run_hf

from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen3_omni.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.speech import synthesize
from omniwalk.models.qwen3_omni.talker import TalkerSamplingParams

pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")


def _setup(case_name: str = "audio_image", config: str = "tiny"):
    hf, talker, cfg = oracle(config)
    vocoder = Code2Wav(cfg.code2wav).eval()
    vocoder.load_state_dict(hf.code2wav.state_dict())
    case = _case(cfg, case_name)
    thinker_result, codes = run_hf(hf, case, "Ethan")
    return hf, talker, vocoder, cfg, case, thinker_result, codes


def _synthesize(hf, talker, vocoder, cfg, case, thinker_result, **kw):
    states = thinker_result.hidden_states
    return synthesize(
        talker,
        vocoder,
        cfg,
        hf.thinker.get_input_embeddings(),
        prompt_ids=case.ids,
        generated_ids=thinker_result.sequences[0, len(case.ids) :].tolist(),
        embeddings=torch.cat([s[0][0] for s in states]),
        accept_hidden=torch.cat([s[cfg.talker.accept_hidden_layer][0] for s in states]),
        spans=case.spans,
        **kw,
    )


@pytest.mark.parametrize("config", ["tiny", "uneven"])
def test_greedy_speech_matches_hf_codes_and_waveform(config):
    hf, talker, vocoder, cfg, case, thinker_result, expected = _setup(config=config)
    params = TalkerSamplingParams(
        talker_temperature=0, code_predictor_temperature=0, max_audio_frames=NUM_FRAMES, min_audio_frames=NUM_FRAMES
    )
    out = _synthesize(hf, talker, vocoder, cfg, case, thinker_result, voice="ETHAN", params=params)
    assert out.codes.dtype == torch.int64 and torch.equal(out.codes, expected)
    with torch.no_grad():
        wav = hf.code2wav(expected.T[None])[0, 0]
    assert out.audio.dtype == torch.float32 and out.audio.shape == (1920 * NUM_FRAMES - 555,)
    assert (out.audio - wav).abs().max() <= 1e-4


def test_eos_stops_after_min_frames():
    """A head that always prefers codec EOS: EOS is masked for min_audio_frames frames, then stops."""
    hf, talker, vocoder, cfg, case, thinker_result, _ = _setup("text")
    eos, original = cfg.talker.codec.eos, talker.group0_logits
    talker.group0_logits = lambda h: original(h).index_add(0, torch.tensor([eos]), torch.tensor([1e4]))
    try:
        params = TalkerSamplingParams(talker_temperature=0, min_audio_frames=3, max_audio_frames=10, seed=0)
        out = _synthesize(hf, talker, vocoder, cfg, case, thinker_result, params=params)
        assert out.codes.shape == (3, cfg.talker.num_code_groups)
        assert out.audio.shape == (1920 * 3 - 555,)
        none = _synthesize(hf, talker, vocoder, cfg, case, thinker_result, params=TalkerSamplingParams(seed=0))
        assert none.codes.shape == (0, cfg.talker.num_code_groups) and none.audio.numel() == 0
    finally:
        del talker.group0_logits


def test_sampling_is_seeded_per_request_and_limited():
    hf, talker, vocoder, cfg, case, thinker_result, _ = _setup("text")

    def run(seed):
        params = TalkerSamplingParams(max_audio_frames=6, min_audio_frames=6, seed=seed)
        return _synthesize(hf, talker, vocoder, cfg, case, thinker_result, voice="chelsie", params=params).codes

    first, again, other = run(1), run(1), run(2)
    assert first.shape == (6, cfg.talker.num_code_groups)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert int(first[:, 0].max()) < cfg.talker.text.vocab_size - 1024  # control codes are suppressed
    assert int(first[:, 1:].max()) < cfg.talker.code_predictor.vocab_size


def test_unknown_voice_fails_before_any_work():
    hf, talker, vocoder, cfg, case, thinker_result, _ = _setup("text")
    with pytest.raises(InvalidRequestError, match="unknown voice 'nobody'.*aiden, chelsie, ethan"):
        _synthesize(hf, talker, vocoder, cfg, case, thinker_result, voice="nobody")


@pytest.mark.parametrize(
    "fields",
    [{"min_audio_frames": 5, "max_audio_frames": 4}, {"talker_temperature": -1.0}, {"code_predictor_top_p": 0.0}],
)
def test_invalid_sampling_params_are_request_errors(fields):
    with pytest.raises(InvalidRequestError):
        TalkerSamplingParams(**fields)


def test_sampling_params_from_request_ignores_other_keys():
    params = TalkerSamplingParams.from_request({"talker_top_k": 7, "temperature": 0.1, "code_predictor_top_p": None})
    assert params.talker_top_k == 7 and params.code_predictor_top_p == 0.8
