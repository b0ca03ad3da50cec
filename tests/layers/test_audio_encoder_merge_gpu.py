"""GPU twin of ``test_audio_encoder_merge.py``: Qwen2.5-Omni's audio encoder fast path (q/k/v in one GEMM,
the conv frontend as GEMMs) against its reference path in bf16 at the 7B's widths (d_model 1,280, 20
heads; four layers), a 4 s clip and a ragged 1.3 s one. bf16 GEMMs of other shapes round apart, so the
bound is a cosine and a share of the output's scale, not equality."""

import copy
import dataclasses

import pytest
import torch

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import load_config_dict
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import AudioEncoder

pytestmark = pytest.mark.gpu


@torch.no_grad()
def test_fast_audio_encoder_equals_reference_in_bf16():
    cfg = Qwen25OmniConfig.from_hf(load_config_dict("qwen2.5-omni-7b")).audio
    cfg = dataclasses.replace(cfg, encoder_layers=4)
    reference = AudioEncoder(cfg, attention_backend="torch_varlen").to("cuda", torch.bfloat16).eval()
    randomize(reference, seed=0)
    fast = copy.deepcopy(reference)
    use_kernels(fast, "fused")
    assert fast.conv_gemms is not None and fast.layers[0].self_attn.qkv is not None
    lengths = [400, 130]
    g = torch.Generator(device="cuda").manual_seed(1)
    features = torch.randn(2, 128, 400, generator=g, device="cuda").to(torch.bfloat16)
    ref, ours = reference(features, lengths).float(), fast(features, lengths).float()
    cosine = torch.nn.functional.cosine_similarity(ref.flatten(), ours.flatten(), dim=0).item()
    worst = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"GPU-AUDIO-MERGE cosine {cosine:.6f}, max error {worst:.4f} of the output's largest value")
    assert cosine >= 0.9999 and worst <= 0.02
