"""Qwen2.5-Omni token2wav DiT's CUDA fast path (``DiT.merge_projections``: one modulation GEMM, merged
q/k/v with head 0 de-interleaved, ``adaln`` and ``head_rope`` kernels) against the reference path, on
the CPU through Triton's interpreter (fp32). The GPU twin (bf16, the 7B config): ``test_dit_gpu.py``."""

import copy

import pytest
import torch
from helpers import triton_cpu

from omniwalk.kernels.adaln import adaln_triton
from omniwalk.kernels.head_rope import head_rope_triton
from omniwalk.layers.decoder import use_kernels
from omniwalk.layers.rotary import head_rope_reference, rope_cos_sin, rotary_tables
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import TINY_CONFIG, audible_token2wav, load_config_dict
from omniwalk.models.qwen2_5_omni.networks.dit import adaln_reference, block_masks
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav, initial_noise

pytestmark = pytest.mark.skipif(not triton_cpu.ON_CPU, reason="interpreter tests run on the CPU machine")
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    yield from triton_cpu.interpreted(monkeypatch)


@pytest.mark.parametrize("with_delta", [False, True])
def test_adaln(with_delta):
    g = torch.Generator().manual_seed(0)
    m, frames, dim = 3, 5, 40  # (dim not a power of two: masked columns)
    h = torch.randn(m, frames, dim, generator=g) * 2 + 0.5
    delta = torch.randn(m, frames, dim, generator=g) if with_delta else None
    vectors = torch.randn(m, 7 * dim, generator=g)  # views of one product, as the merged modulation gives
    gate, scale, shift = vectors[:, dim : 2 * dim], vectors[:, 3 * dim : 4 * dim], vectors[:, 6 * dim :]
    ref = adaln_reference(h, delta, gate if with_delta else None, scale, shift)
    ours = adaln_triton(h, delta, gate if with_delta else None, scale, shift)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert (ours[0] is h) == (not with_delta)


def test_adaln_rejects_vectors_it_cannot_index():
    h = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="row stride"):
        adaln_triton(h, None, None, torch.randn(8, 2).T, torch.randn(2, 8))


def test_head_rope_rotates_head_zero_of_q_and_k_only():
    g = torch.Generator().manual_seed(1)
    m, frames, heads, d = 2, 7, 3, 16
    qkv = torch.randn(m, frames, 3 * heads * d, generator=g)
    cos, sin = rotary_tables(*rope_cos_sin(torch.arange(frames), d, 10000.0), torch.float32)
    ref = head_rope_reference(qkv, cos, sin, heads)
    parts, before = ref.view(m, frames, 3, heads, d), qkv.view(m, frames, 3, heads, d)
    assert torch.equal(parts[:, :, 2], before[:, :, 2]) and torch.equal(parts[:, :, :2, 1:], before[:, :, :2, 1:])
    assert not torch.equal(parts[:, 1:, :2, 0], before[:, 1:, :2, 0])  # (position 0 turns by nothing)
    ours = head_rope_triton(qkv.clone(), cos, sin, heads)
    torch.testing.assert_close(ours, ref, **TOL)


@pytest.fixture(scope="module")
def token2wav():
    cfg = Qwen25OmniConfig.from_hf(load_config_dict(TINY_CONFIG)).token2wav
    g = torch.Generator().manual_seed(3)
    speaker = {
        "cond": torch.randn(1, cfg.dit.enc_emb_dim, generator=g),
        "ref_mel": torch.randn(1, 30, cfg.dit.mel_dim, generator=g) - 4.0,
    }
    model = Token2Wav(cfg).eval()
    audible_token2wav(model, speaker, 0)
    return model, speaker


@torch.inference_mode()
def test_fast_path_velocity_equals_the_reference(token2wav):
    """Rows of three lengths padded to one (padding never attended), each at its own time."""
    model, speaker = token2wav
    fast = copy.deepcopy(model)
    use_kernels(fast, "fused")
    dit = fast.dit
    assert dit.modulation is not None and dit.transformer_blocks[0].attn.to_qkv is not None
    assert dit.transformer_blocks[0].attn_norm.linear is None and dit.transformer_blocks[0].attn.to_q is None
    cfg, lengths, total = model.cfg.dit, [96, 70, 48], 96
    g = torch.Generator().manual_seed(5)
    rows = model.speaker_rows(speaker["cond"], speaker["ref_mel"])
    conditions = [
        model.dit.condition_rows(rows, torch.randint(0, cfg.num_embeds, (n // 2,), generator=g)) for n in lengths
    ]
    padded = torch.stack([torch.nn.functional.pad(c, (0, 0, 0, total - c.shape[1])) for c in conditions])
    conditions = torch.cat([padded[:, 0], padded[:, 1]])
    x = torch.randn(3, total, cfg.mel_dim, generator=g)
    t = torch.tensor([0.1, 0.5, 0.9])
    masks = block_masks(cfg, lengths * 2, total, "cpu")
    ref = model.dit.velocity(x, t, conditions, masks, 0.5)
    ours = fast.dit.velocity(x, t, conditions, masks, 0.5)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(ours[i, :n], ref[i, :n], **TOL)


@torch.inference_mode()
def test_fast_path_waveform_equals_the_reference(token2wav):
    model, speaker = token2wav
    fast = copy.deepcopy(model)
    use_kernels(fast, "fused")
    codes = torch.randint(0, model.cfg.dit.num_embeds, (40,), generator=torch.Generator().manual_seed(9))
    rows = model.speaker_rows(speaker["cond"], speaker["ref_mel"])
    noise = initial_noise(4, 40 * model.cfg.dit.repeats, model.cfg.dit.mel_dim)
    ref, ours = model(codes, rows, noise, 4), fast(codes, rows, noise, 4)
    assert ref.abs().max() > 0.05  # (audible)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
