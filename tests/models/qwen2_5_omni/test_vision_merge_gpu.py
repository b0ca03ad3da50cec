"""GPU twin of ``test_vision_merge.py``: the vision encoder's merged, padded fast path
against its reference path in bf16 at the 7B's widths (hidden 1,280, intermediate 3,420: padded to
3,456), four blocks (one full-attention), a 640x480 image's grid. bf16 GEMMs of other shapes round
apart, so the bound is a cosine and a share of the output's scale, not equality."""

import copy
import dataclasses

import pytest
import torch

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import load_config_dict
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import VisionEncoder

pytestmark = pytest.mark.gpu


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
