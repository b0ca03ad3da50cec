"""Thinker parity with HF (fp32, CPU) on both tiny configs and every prompt shape.

Encoder outputs come from HF's own encoders, so this isolates the thinker LM: embedding
scatter, DeepStack, MRoPE attention, MoE, lm_head, KV-cached decoding and the sampler's
greedy path and logprobs.
"""

from functools import cache

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_oracle import hf_checkpoint, hf_model
from helpers.processor_oracle import thinker_cases
from helpers.single_request import ContiguousKVCache, Sampler

from omniwalk.errors import InvalidRequestError
from omniwalk.modality import Modality
from omniwalk.models.common.networks.thinker import MediaEmbeddings, Thinker
from omniwalk.models.common.processing.positions import mrope_positions
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components
from omniwalk.sampling import SamplingParams

NEW_TOKENS = 64
CONFIGS = ("tiny", "uneven")
CASE_NAMES = [c.name for c in thinker_cases(Qwen3OmniConfig.from_hf(hf_model("tiny").config.to_dict()).tokens)]


@cache
def ours(name: str) -> tuple[Thinker, Qwen3OmniConfig]:
    ckpt = hf_checkpoint(name)
    cfg = Qwen3OmniConfig.from_hf(ckpt)
    return load_components(ckpt, ("thinker",), cfg=cfg)["thinker"], cfg


def case_by_name(cfg, name):
    return next(c for c in thinker_cases(cfg.tokens) if c.name == name)


@torch.no_grad()
def hf_media(hf, inputs) -> MediaEmbeddings:
    m = hf.thinker.model
    media = MediaEmbeddings()
    if "input_features" in inputs:
        features = m.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"])
        media.rows[Modality.AUDIO] = features.last_hidden_state
    for kind, pixels, grid in (
        (Modality.IMAGE, "pixel_values", "image_grid_thw"),
        (Modality.VIDEO, "pixel_values_videos", "video_grid_thw"),
    ):
        if pixels in inputs:
            fn = m.get_image_features if kind == Modality.IMAGE else m.get_video_features
            out = fn(inputs[pixels], inputs[grid])
            media.rows[kind] = torch.cat(out.pooler_output)
            media.deepstack[kind] = torch.stack([torch.cat(level) for level in out.deepstack_features])
    return media


@torch.no_grad()
def run_ours(thinker, cfg, case, media, params):
    """Prefill + greedy decode with our thinker and sampler -> (prefill logits, tokens, logprobs)."""
    rope = mrope_positions(len(case.ids), case.spans, cfg.position_id_per_seconds)
    kv = ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu")
    sampler = Sampler(params, (cfg.tokens.im_end,), case.ids)
    out = thinker(torch.tensor(case.ids), rope.positions, kv, media, all_logits=True)
    prefill, logits, picks = out.logits, out.logits[-1], []
    for step in range(params.max_tokens):
        picks.append(sampler(logits))
        index = len(case.ids) + step
        logits = thinker(torch.tensor([picks[-1].token_id]), rope.decode(index), kv).logits[-1]
    return prefill, picks


@pytest.mark.parametrize("case_name", CASE_NAMES)
@pytest.mark.parametrize("config", CONFIGS)
@torch.no_grad()
def test_greedy_generation_matches_hf(config, case_name):
    hf = hf_model(config)
    thinker, cfg = ours(config)
    case = case_by_name(cfg, case_name)
    inputs = case.hf_inputs()
    expected_prefill = hf.thinker(**inputs).logits[0]
    gen = hf.thinker.generate(
        **inputs,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    params = SamplingParams(
        max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, logprobs=True, top_logprobs=3
    )
    prefill, picks = run_ours(thinker, cfg, case, hf_media(hf, inputs), params)

    assert F.cosine_similarity(prefill, expected_prefill, dim=-1).min() >= 0.99999
    assert [p.token_id for p in picks] == gen.sequences[0, len(case.ids) :].tolist()
    hf_logprobs = torch.log_softmax(torch.cat(gen.logits).float(), dim=-1)
    for step, pick in enumerate(picks):
        assert abs(pick.logprob - hf_logprobs[step, pick.token_id].item()) < 1e-4
        top_values, top_ids = hf_logprobs[step].topk(3)
        assert [t for t, _ in pick.top] == top_ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in pick.top]), top_values, atol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
@torch.no_grad()
def test_talker_states_match_hf_hidden_states(config):
    hf = hf_model(config)
    thinker, cfg = ours(config)
    case = case_by_name(cfg, "audio_image")
    inputs = case.hf_inputs()
    hidden = hf.thinker(**inputs, output_hidden_states=True).hidden_states
    rope = mrope_positions(len(case.ids), case.spans, cfg.position_id_per_seconds)
    kv = ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu")
    out = thinker(torch.tensor(case.ids), rope.positions, kv, hf_media(hf, inputs), talker_states=True)
    assert torch.allclose(out.embeddings, hidden[0][0], atol=1e-5)
    assert torch.allclose(out.accept_hidden, hidden[cfg.talker.accept_hidden_layer][0], atol=1e-4)
    assert out.logits.shape[0] == 1  # only the last position's logits by default


@torch.no_grad()
def test_placeholder_feature_mismatch_is_a_typed_error():
    thinker, cfg = ours("tiny")
    case = case_by_name(cfg, "image")
    hidden = cfg.text.hidden_size
    n = case.ids.count(cfg.tokens.image_pad)
    image = Modality.IMAGE
    media = MediaEmbeddings({image: torch.zeros(n - 1, hidden)}, {image: torch.zeros(3, n - 1, hidden)})
    kv = ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu")
    with pytest.raises(InvalidRequestError, match=f"{n} image placeholder tokens but .* {n - 1} embeddings"):
        thinker(torch.tensor(case.ids), torch.arange(len(case.ids)), kv, media)
