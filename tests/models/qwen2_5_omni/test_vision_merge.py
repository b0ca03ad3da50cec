"""Qwen2.5-Omni vision encoder's CUDA fast path (``merge_projections`` via ``use_kernels``: q/k/v in one
GEMM, gate/up in one GEMM padded to a multiple of ``ALIGN`` with the silu·mul kernel) against the
reference path (itself HF's: ``test_encoders.py``), on the CPU through Triton's
interpreter in fp32, with an intermediate width that needs the padding (the 7B's 3,420 does)."""

import copy
import dataclasses

import pytest
import torch
from helpers import triton_cpu

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import load_config_dict
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import ALIGN, VisionEncoder

pytestmark = pytest.mark.skipif(not triton_cpu.ON_CPU, reason="interpreter tests run on the CPU machine")


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    yield from triton_cpu.interpreted(monkeypatch)


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
