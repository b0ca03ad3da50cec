"""The audio encoders' CUDA fast path (``merge_projections`` via ``use_kernels``: q/k/v in one GEMM, a
bias-free k_proj adding zeros; Qwen2.5-Omni's conv frontend as GEMMs over its windows) against the
reference path (itself HF's: ``models/qwen3_omni/test_audio_encoder.py``,
``models/qwen2_5_omni/test_encoders.py``), in fp32 on the CPU. Plain ``nn.Linear``s: no Triton kernel is involved.

GPU twin of ``test_audio_encoder_merge.py``: Qwen2.5-Omni's audio encoder fast path (q/k/v in one GEMM,
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
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import AudioEncoder as Qwen25AudioEncoder
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import load_config_dict as load_qwen3_config
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder as Qwen3AudioEncoder


def _pair(encoder: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference = encoder.eval()
    randomize(reference, seed=5)
    fast = copy.deepcopy(reference)
    use_kernels(fast, "fused")
    return reference, fast


@pytest.mark.parametrize("lengths", [[37], [400], [1234, 57, 401, 9]])  # one chunk, whole chunks, ragged
@torch.no_grad()
def test_qwen2_5_fast_audio_encoder_equals_reference(lengths):
    reference, fast = _pair(Qwen25AudioEncoder(Qwen25OmniConfig.from_hf(load_config_dict(None)).audio))
    layer = fast.layers[0].self_attn
    assert layer.qkv.out_features == 3 * fast.cfg.d_model and not hasattr(layer, "k_proj")
    assert fast.conv_gemms is not None and not hasattr(fast, "conv1")
    features = torch.randn(len(lengths), 128, max(lengths), generator=torch.Generator().manual_seed(len(lengths)))
    ref, ours = reference(features, lengths), fast(features, lengths)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_qwen3_fast_audio_encoder_equals_reference():
    reference, fast = _pair(Qwen3AudioEncoder(Qwen3OmniConfig.from_hf(load_qwen3_config(None)).audio))
    assert fast.layers[0].self_attn.qkv is not None
    lengths = [213, 1234]
    features = torch.randn(len(lengths), 128, max(lengths), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(fast(features, lengths), reference(features, lengths), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
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
