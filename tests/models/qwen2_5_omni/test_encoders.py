"""Qwen2.5-Omni's audio and vision encoders vs HF's (fp32, two tiny configs, random weights and
inputs), packed several items per call; the window layout vs HF's ``get_vision_window_index``.

Qwen2.5-Omni vision encoder's CUDA fast path (``merge_projections`` via ``use_kernels``: q/k/v in one
GEMM, gate/up in one GEMM padded to a multiple of ``ALIGN`` with the silu·mul kernel) against the
reference path (itself HF's: the tests above), on the CPU through Triton's
interpreter in fp32, with an intermediate width that needs the padding (the 7B's 3,420 does).

The GPU twin of that test: the vision encoder's merged, padded fast path
against its reference path in bf16 at the 7B's widths (hidden 1,280, intermediate 3,420: padded to
3,456), four blocks (one full-attention), a 640x480 image's grid. bf16 GEMMs of other shapes round
apart, so the bound is a cosine and a share of the output's scale, not equality."""

import copy
import dataclasses
from functools import cache

import numpy as np
import pytest
import torch
from helpers.qwen2_5_omni import hf_checkpoint, hf_model
from helpers.triton_cpu import CPU_ONLY

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import load_components
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import load_config_dict
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import audio_output_lengths
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import ALIGN, VisionEncoder, window_layout


@cache
def encoders(name: str) -> dict:
    cfg = Qwen25OmniConfig.from_hf(hf_checkpoint(name))
    return load_components(hf_checkpoint(name), ("audio_encoder", "vision_encoder"), cfg)


@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_audio_encoder_matches_hf(name):
    frames = [250, 73, 100, 1]  # whole chunks, ragged tails, one frame
    features = torch.randn(len(frames), 128, max(frames), generator=torch.Generator().manual_seed(1))
    ours = encoders(name)["audio_encoder"](features, frames)
    mask = (torch.arange(max(frames))[None] < torch.tensor(frames)[:, None]).long()
    ref = hf_model(name).thinker.get_audio_features(features, feature_attention_mask=mask).last_hidden_state
    assert ours.shape[0] == sum(int(audio_output_lengths(n)) for n in frames)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_vision_encoder_matches_hf(name):
    grids = [(1, 8, 12), (2, 6, 4), (1, 10, 14), (3, 2, 2)]  # windows ragged at both edges, videos
    pixels = torch.randn(
        sum(t * h * w for t, h, w in grids), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(2)
    )
    out = encoders(name)["vision_encoder"](pixels, grids)
    ref = hf_model(name).thinker.get_image_features(pixels, torch.tensor(grids)).pooler_output
    assert [m.shape[0] for m, _ in out.split()] == [r.shape[0] for r in ref]
    torch.testing.assert_close(out.embeddings, torch.cat(ref), rtol=0, atol=2e-5)


@pytest.mark.parametrize("window", [56, 84, 112])
def test_window_layout_is_hf_window_index(window):
    from transformers.vision_utils import get_vision_window_index

    grids = [(1, 8, 12), (2, 6, 4), (1, 10, 14)]
    index, cu = get_vision_window_index(torch.tensor(grids), 2, window, 14)
    ours = window_layout(grids, 2, window // 2 // 14)
    assert torch.equal(ours.tokens, index)
    assert ours.windows == np.diff(cu.numpy()).tolist()


@CPU_ONLY
@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("intermediate", [ALIGN, 3 * ALIGN - 10])
@torch.no_grad()
def test_merged_vision_encoder_equals_reference(intermediate):
    cfg = Qwen25OmniConfig.from_hf(load_config_dict(None)).vision
    cfg = dataclasses.replace(cfg, intermediate_size=intermediate)
    reference = VisionEncoder(cfg).eval()
    randomize(reference, seed=3)
    fast = copy.deepcopy(reference)
    use_kernels(fast, "fused")
    mlp = fast.blocks[0].mlp
    assert mlp.gate_up.out_features == 2 * -(-intermediate // ALIGN) * ALIGN and not hasattr(mlp, "up_proj")
    assert fast.blocks[0].attn.qkv.out_features == 3 * cfg.hidden_size
    grids = [(1, 8, 12), (2, 6, 4), (3, 2, 2)]  # windows ragged at the edges, videos
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), cfg.patch_dim, generator=torch.Generator().manual_seed(2))
    ref, ours = reference(pixels, grids), fast(pixels, grids)
    torch.testing.assert_close(ours.embeddings, ref.embeddings, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@torch.no_grad()
def test_merged_vision_encoder_equals_reference_in_bf16():
    cfg = Qwen25OmniConfig.from_hf(load_config_dict("qwen2.5-omni-7b")).vision
    cfg = dataclasses.replace(cfg, depth=4, fullatt_block_indexes=(2,))
    reference = VisionEncoder(cfg, attention_backend="torch_varlen").to("cuda", torch.bfloat16).eval()
    randomize(reference, seed=0)
    fast = copy.deepcopy(reference)
    use_kernels(fast, "fused")
    assert fast.blocks[0].mlp.gate_up.out_features == 2 * 3456
    grids = [(1, 34, 46)]  # 476 x 644 pixels: a 640x480 image at its smart_resize size
    g = torch.Generator(device="cuda").manual_seed(1)
    pixels = torch.randn(34 * 46, cfg.patch_dim, generator=g, device="cuda").to(torch.bfloat16)
    ref, ours = reference(pixels, grids).embeddings.float(), fast(pixels, grids).embeddings.float()
    cosine = torch.nn.functional.cosine_similarity(ref.flatten(), ours.flatten(), dim=0).item()
    worst = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"GPU-Q25-VISION-MERGE cosine {cosine:.6f}, max error {worst:.4f} of the output's largest value")
    assert cosine >= 0.9999 and worst <= 0.02
