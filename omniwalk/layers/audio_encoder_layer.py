"""The Whisper-style audio encoder layer (bidirectional attention over packed segments, pre-LN,
GELU MLP) and its sinusoidal positions, as HF's ``WhisperEncoderLayer`` computes them. Parameter
names mirror the checkpoints (``self_attn.q_proj``, ``self_attn_layer_norm``, ``fc1`` ...). With the
fused kernels (``decoder.use_fused_kernels``, after loading) q/k/v run as one biased GEMM (a bias-free
k_proj adds zeros): two GEMM launches fewer per layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.layers.attention import varlen_attention
from omniwalk.layers.linear import MergesProjections, stacked_linear


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels]: sin of the first half of the frequencies, cos of the second half."""
    half = channels // 2
    inv = torch.exp(-(math.log(max_timescale) / (half - 1)) * torch.arange(half, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([t.sin(), t.cos()], dim=1)


class AudioAttention(MergesProjections):
    def __init__(self, cfg, key_bias: bool = True):
        super().__init__()
        d = cfg.d_model
        self.num_heads, self.head_dim = cfg.encoder_attention_heads, cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d, bias=key_bias), nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.qkv: nn.Linear | None = None  # the fast path's merged projection (``merge_projections``)

    def merge_projections(self) -> None:
        parts = (self.q_proj, self.k_proj, self.v_proj)
        biases = [p.bias if p.bias is not None else torch.zeros_like(p.weight[:, 0]) for p in parts]
        self.qkv = stacked_linear([p.weight for p in parts], biases)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, backend: str) -> torch.Tensor:
        shape = (x.shape[0], self.num_heads, self.head_dim)
        if self.qkv is not None:
            q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        else:
            q, k, v = (proj(x).view(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = varlen_attention(
            q, k, v, cu_seqlens, max_seqlen, causal=False, scale=self.head_dim**-0.5, backend=backend
        )
        return self.out_proj(out.reshape(x.shape[0], -1))


class AudioEncoderLayer(nn.Module):
    """Pre-LN: attention (``key_bias``: k_proj has a bias), GELU MLP. ``cfg``: an audio encoder
    config (``d_model``, ``encoder_attention_heads``, ``head_dim``, ``encoder_ffn_dim``)."""

    def __init__(self, cfg, key_bias: bool = True):
        super().__init__()
        self.self_attn = AudioAttention(cfg, key_bias)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, backend: str) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), cu_seqlens, max_seqlen, backend)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
