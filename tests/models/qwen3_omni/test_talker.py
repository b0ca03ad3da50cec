"""Talker + code predictor parity with HF (fp32, CPU): greedy codec codes, all groups, >= 32 frames.

HF runs its whole ``generate(return_audio=True)``; we capture its thinker outputs (the talker's
inputs) and the codes it hands to code2wav, then build our talker prompt from the same thinker
outputs and generate with our talker. EOS is masked (``min_new_tokens``) so every run is long.
"""

import copy
from functools import cache

import numpy as np
import pytest
import torch
from helpers.hf_oracle import config_dict, hf_checkpoint, hf_model
from helpers.processor_oracle import thinker_cases
from helpers.single_request import build_talker_prompt, talker_generate

from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components
from omniwalk.models.qwen3_omni.networks.talker import Talker, TalkerSamplingParams
from omniwalk.models.qwen3_omni.processing.talker_prompt import resolve_speaker

NUM_FRAMES = 32
NUM_TEXT_TOKENS = 10
CONFIGS = ("tiny", "uneven")
CASES = ("text", "audio", "image", "video", "audio_image", "image_audio_image", "multi_turn")
VOICES = ("chelsie", "Ethan", "AIDEN")
# HF warns on every talker generate that its repetition penalty only sees generated codes: intended.
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")


@cache
def oracle(name: str):
    """(HF model, our talker, config). The HF copy gets random talker experts: HF leaves them
    uninitialised (torch.empty), which would make the routed experts contribute ~nothing."""
    hf = copy.deepcopy(hf_model(name, 0))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in hf.talker.model.layers:
            for p in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    cfg = Qwen3OmniConfig.from_hf(config_dict(name))
    talker = Talker(cfg.talker).eval()
    talker.load_state_dict(hf.talker.state_dict())
    return hf, talker, cfg


@torch.no_grad()
def run_hf(hf, case, voice: str):
    """HF greedy speech generation -> (thinker result, talker codes [F, G])."""
    captured = {}
    thinker_generate, chunked_decode = hf.thinker.generate, hf.code2wav.chunked_decode

    def keep_thinker(*args, **kwargs):
        captured["thinker"] = thinker_generate(*args, **kwargs)
        return captured["thinker"]

    def keep_codes(codes, **kwargs):
        captured["codes"] = codes[0].T.clone()
        return chunked_decode(codes, **kwargs)

    hf.thinker.generate, hf.code2wav.chunked_decode = keep_thinker, keep_codes
    try:
        hf.generate(
            **case.hf_inputs(),
            speaker=voice,
            thinker_max_new_tokens=NUM_TEXT_TOKENS,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=NUM_FRAMES + 1,  # the last group-0 token never gets its residual codes
            talker_min_new_tokens=NUM_FRAMES + 1,
        )
    finally:
        del hf.thinker.generate, hf.code2wav.chunked_decode
    return captured["thinker"], captured["codes"]


@torch.no_grad()
def run_ours(hf, talker, cfg, case, thinker_result, voice: str) -> torch.Tensor:
    states = thinker_result.hidden_states
    t = cfg.tokens
    special = hf.thinker.get_input_embeddings()(torch.tensor([t.tts_bos, t.tts_eos, t.tts_pad]))
    prompt = build_talker_prompt(
        talker,
        t,
        prompt_ids=case.ids,
        generated_ids=thinker_result.sequences[0, len(case.ids) :].tolist(),
        embeddings=torch.cat([s[0][0] for s in states]),
        accept_hidden=torch.cat([s[cfg.talker.accept_hidden_layer][0] for s in states]),
        special_embeddings=special,
        spans=case.spans,
        speaker=resolve_speaker(cfg.talker.speaker_ids, voice),
        position_id_per_seconds=cfg.position_id_per_seconds,
    )
    params = TalkerSamplingParams(
        talker_temperature=0, code_predictor_temperature=0, max_audio_frames=NUM_FRAMES, min_audio_frames=NUM_FRAMES
    )
    return torch.stack(list(talker_generate(talker, prompt, params)))


def _case(cfg, name):
    return next(c for c in thinker_cases(cfg.tokens) if c.name == name)


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("config", CONFIGS)
def test_greedy_codes_match_hf(config, case_name):
    hf, talker, cfg = oracle(config)
    case = _case(cfg, case_name)
    thinker_result, expected = run_hf(hf, case, "Ethan")
    got = run_ours(hf, talker, cfg, case, thinker_result, "Ethan")
    assert expected.shape == (NUM_FRAMES, cfg.talker.num_code_groups)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("voice", VOICES)
@pytest.mark.parametrize("config", CONFIGS)
def test_each_voice_matches_hf(config, voice):
    hf, talker, cfg = oracle(config)
    case = _case(cfg, "audio")
    thinker_result, expected = run_hf(hf, case, voice)
    assert torch.equal(run_ours(hf, talker, cfg, case, thinker_result, voice), expected)


def test_voices_change_the_codes_and_do_not_leak():
    """Same inputs, different voices -> different codes; going back to a voice reproduces its codes."""
    hf, talker, cfg = oracle("tiny")
    case = _case(cfg, "text")
    thinker_result, _ = run_hf(hf, case, "Ethan")
    runs = [run_ours(hf, talker, cfg, case, thinker_result, v) for v in ("ethan", "chelsie", "ethan")]
    assert not torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], runs[2])


def test_unknown_voice_is_a_typed_error_listing_voices():
    _, _, cfg = oracle("tiny")
    with pytest.raises(InvalidRequestError, match="aiden, chelsie, ethan"):
        resolve_speaker(cfg.talker.speaker_ids, "Dylan")


def test_talker_loads_from_checkpoint():
    ckpt = hf_checkpoint("uneven")
    talker = load_components(ckpt, ("talker",))["talker"]
    reference = hf_model("uneven", 0).talker.state_dict()
    for key, value in talker.state_dict().items():
        assert torch.equal(value, reference[key]), key


def test_user_positions_are_the_user_turns():
    """The talker's user part: every token from a <|im_start|> whose role is the user's to the next
    <|im_start|> (the ids' last token a start: no role), as the token-by-token rule reads them."""
    from omniwalk.models.qwen3_omni.checkpoint.tiny import TINY_CONFIG, load_config_dict
    from omniwalk.models.qwen3_omni.processing.talker_prompt import user_positions

    t = Qwen3OmniConfig.from_hf(load_config_dict(TINY_CONFIG)).tokens
    rng = np.random.default_rng(0)
    alphabet = [t.im_start, t.user, t.assistant, 7, 8, 9]
    for n in (0, 1, 2, 5, 40, 200):
        for _ in range(20):
            ids = [int(x) for x in rng.choice(alphabet, n)]
            role, want = None, []
            for i, token in enumerate(ids):
                if token == t.im_start:
                    role = ids[i + 1] if i + 1 < n else None
                want.append(role == t.user)
            assert user_positions(ids, t).tolist() == want
