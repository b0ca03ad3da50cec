"""Thinker parity with HF (fp32, CPU) on both tiny configs and every prompt shape.

Encoder outputs come from HF's own encoders, so this isolates the thinker LM: embedding
scatter, DeepStack, MRoPE attention, MoE, lm_head, KV-cached decoding and the sampler's
greedy path and logprobs.

Full-size thinker layers in bf16 on CUDA vs HF bf16 (the real 30B config, 3 layers, random weights).

Runs HF's text model directly (no encoders): an image-shaped run of random embeddings with
random DeepStack features and 3-D MRoPE positions exercises the multimodal path.

NOTE: bf16 rounding differences can flip a token's top-8 expert set when the 8th and 9th router
scores nearly tie (measured: 1-4 of 90 tokens per layer with random weights). A flip swaps 1/8
of that token's MoE output, a discrete jump rather than numeric error, so the per-token bar
(cosine >= 0.999) applies to tokens routed identically in every layer; all tokens must still
agree on average, and flips must stay rare."""

import json
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_oracle import hf_checkpoint, hf_model
from helpers.processor_oracle import thinker_cases
from helpers.single_request import ContiguousKVCache, Sampler

from omniwalk.errors import InvalidRequestError
from omniwalk.layers.decoder import use_kernels
from omniwalk.modality import Modality
from omniwalk.models.common.networks.thinker import MediaEmbeddings, Thinker
from omniwalk.models.common.processing.positions import IMAGE, MediaSpan, mrope_positions
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS
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


REAL_CONFIG = PRESETS["qwen3-omni-30b-a3b"]
NUM_LAYERS = 3


def _real_config() -> dict:
    data = json.loads(REAL_CONFIG.read_text())
    data["thinker_config"]["text_config"]["num_hidden_layers"] = NUM_LAYERS
    data["talker_config"]["accept_hidden_layer"] = NUM_LAYERS  # must name an existing thinker layer
    return data


@torch.no_grad()
def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=g, device="cuda", dtype=torch.float32)
        value = 1 + 0.1 * noise if "norm" in name else noise * (p.shape[-1] ** -0.5)
        p.copy_(value.to(p.dtype))


def _record_routes(hf, ours, top_k: int) -> tuple[list, list]:
    """Per layer, each token's sorted expert ids: from HF's router output and from our gate's logits."""
    hf_routes, our_routes = [], []
    for layer in hf.layers:
        layer.mlp.gate.register_forward_hook(lambda m, a, out: hf_routes.append(out[2].sort(-1).values))
    for layer in ours.model.layers:
        layer.mlp.gate.register_forward_hook(
            lambda m, a, out: our_routes.append(out.float().topk(top_k, -1).indices.sort(-1).values)
        )
    return hf_routes, our_routes


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["reference", "fused"])
@torch.no_grad()
def test_full_size_thinker_layers_bf16_match_hf(kernels):
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

    data = _real_config()
    cfg = Qwen3OmniConfig.from_hf(data)
    hf_text_cfg = Qwen3OmniMoeConfig(**data).thinker_config.text_config
    with torch.device("cuda"):
        hf = Qwen3OmniMoeThinkerTextModel._from_config(hf_text_cfg, dtype=torch.bfloat16).eval()
        hf_head = torch.nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False, dtype=torch.bfloat16)
        moe = "fused" if kernels == "fused" else "reference"
        ours = Thinker(cfg.text, cfg.tokens, cfg.talker.accept_hidden_layer, moe).to(torch.bfloat16).eval()
    _randomize(hf)
    _randomize(hf_head, seed=1)
    state = {f"model.{k}": v for k, v in hf.state_dict().items()} | {"lm_head.weight": hf_head.weight}
    ours.load_state_dict(state, strict=True)
    use_kernels(ours, kernels)  # merged projections, fused kernels

    t = cfg.tokens
    grid = (1, 6, 8)  # merged 6 x 8 image
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 150000, (40,), generator=g).tolist()
    ids = text[:20] + [t.vision_start] + [t.image_pad] * 48 + [t.vision_end] + text[20:]
    rope = mrope_positions(len(ids), [MediaSpan(IMAGE, 20, grid=grid)], cfg.position_id_per_seconds)
    ids_t = torch.tensor(ids, device="cuda")
    image = torch.randn(48, cfg.text.hidden_size, generator=g).to("cuda", torch.bfloat16)
    deepstack = torch.randn(3, 48, cfg.text.hidden_size, generator=g).to("cuda", torch.bfloat16)

    hf_routes, our_routes = _record_routes(hf, ours, cfg.text.num_experts_per_tok)
    embeds = hf.embed_tokens(ids_t)
    mask = ids_t == t.image_pad
    embeds[mask] = image
    out = hf(
        inputs_embeds=embeds[None],
        position_ids=rope.positions.cuda()[:, None],
        visual_pos_masks=mask[None],
        deepstack_visual_embeds=list(deepstack),
    ).last_hidden_state
    expected = hf_head(out)[0].float()

    kv = ContiguousKVCache.for_config(cfg.text, torch.bfloat16, "cuda")
    media = MediaEmbeddings({Modality.IMAGE: image}, {Modality.IMAGE: deepstack})
    got = ours(ids_t, rope.positions.cuda(), kv, media, all_logits=True).logits.float()
    cosine = F.cosine_similarity(got, expected, dim=-1)
    same_route = torch.stack([(a == b).all(-1) for a, b in zip(hf_routes, our_routes, strict=True)]).all(0)
    # bf16 rounding moves ~10% of tokens onto another top-8 set in some layer (0.900 of tokens kept their route
    # with cuDNN SDPA, 0.889 with flash/efficient SDPA); those tokens are why the per-token minimum drops.
    overall = F.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    # The fp32 truth (HF in fp32 on the same weights): how far each bf16 path is from the exact function.
    hf.float()
    truth = hf_head.float()(
        hf(
            inputs_embeds=embeds[None].float(),
            position_ids=rope.positions.cuda()[:, None],
            visual_pos_masks=mask[None],
            deepstack_visual_embeds=[d.float() for d in deepstack],
        ).last_hidden_state
    )[0]
    truth_hf = F.cosine_similarity(expected.flatten(), truth.flatten(), dim=0)
    truth_ours = F.cosine_similarity(got.flatten(), truth.flatten(), dim=0)
    print(f"GPU-PARITY thinker ({kernels} kernels) vs fp32 truth: HF bf16 {truth_hf:.6f} ours bf16 {truth_ours:.6f}")
    print(
        f"GPU-PARITY thinker ({kernels} kernels) logits cosine: all logits {overall:.6f} "
        f"per-token mean {cosine.mean():.6f} min {cosine.min():.6f} "
        f"same-route min {cosine[same_route].min():.6f} same-route share {same_route.float().mean():.3f}"
    )
    assert cosine[same_route].min() >= 0.999, cosine[same_route].min()
    # Both paths round as HF does where it matters for routes (the fused one: q/k norm + rope bitwise, the
    # MoE's expert outputs added in HF's order and steps); issue 15's bar is the all-logits cosine.
    assert overall >= 0.9996, overall
    assert same_route.float().mean() >= 0.85, same_route.float().mean()
    assert cosine.mean() >= 0.999, cosine.mean()
