"""Full-size thinker layers in bf16 on CUDA vs HF bf16 (the real 30B config, 3 layers, random weights).

Runs HF's text model directly (no encoders): an image-shaped run of random embeddings with
random DeepStack features and 3-D MRoPE positions exercises the multimodal path.

NOTE: bf16 rounding differences can flip a token's top-8 expert set when the 8th and 9th router
scores nearly tie (measured: 1-4 of 90 tokens per layer with random weights). A flip swaps 1/8
of that token's MoE output, a discrete jump rather than numeric error, so the per-token bar
(cosine >= 0.999) applies to tokens routed identically in every layer; all tokens must still
agree on average, and flips must stay rare.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from helpers.single_request import ContiguousKVCache

from omniwalk.layers.decoder import use_kernels
from omniwalk.modality import Modality
from omniwalk.models.common.networks.thinker import MediaEmbeddings, Thinker
from omniwalk.models.common.processing.positions import IMAGE, MediaSpan, mrope_positions
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS

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
