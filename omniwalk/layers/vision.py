"""Vision-transformer pieces both families' vision encoders use: patch grids, the packed output,
the patch embedding (a Conv3d applied as one Linear), merge-block patch order and the 2-D rotary
(row, col) of HF's vision rotary embedding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.layers.attention import varlen_attention
from omniwalk.layers.rotary import apply_rotary

Grid = tuple[int, int, int]  # (t, h, w) in patches; h and w are multiples of the merge size


@dataclass
class VisionOutput:
    """``embeddings`` [Σ tokens, out] and one tensor of the same shape per DeepStack level."""

    embeddings: torch.Tensor
    deepstack: list[torch.Tensor]
    tokens_per_item: list[int]

    def split(self) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Per input item: (embeddings, [level tensors])."""
        mains = self.embeddings.split(self.tokens_per_item)
        levels = [d.split(self.tokens_per_item) for d in self.deepstack]
        return [(m, [lvl[i] for lvl in levels]) for i, m in enumerate(mains)]


class PatchProjection(nn.Module):
    """Holds the checkpoint's Conv3d weight [hidden, C, t, p, p] but applies it as one Linear."""

    def __init__(self, hidden: int, channels: int, temporal: int, patch: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, channels, temporal, patch, patch))
        self.bias = nn.Parameter(torch.empty(hidden)) if bias else None

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.linear(patches.to(self.weight.dtype), self.weight.view(self.weight.shape[0], -1), self.bias)


class PatchEmbed(nn.Module):
    """Flattened patches [P, C*t*p*p] -> [P, hidden] (the checkpoint's ``patch_embed.proj``)."""

    def __init__(self, hidden: int, channels: int, temporal: int, patch: int, bias: bool = True):
        super().__init__()
        self.proj = PatchProjection(hidden, channels, temporal, patch, bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(patches)


def rotary_2d_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """head_dim/2 rotary angles: half for rows, half for columns -> the [head_dim / 4] frequencies."""
    quarter = head_dim // 4
    return 1.0 / theta ** (torch.arange(0, 2 * quarter, 2, dtype=torch.float32) / (2 * quarter))


def block_order(grid: torch.Tensor, merge: int) -> torch.Tensor:
    """[h, w, ...] in raster order -> [h * w, ...] in merge-block order."""
    h, w = grid.shape[:2]
    blocks = grid.reshape(h // merge, merge, w // merge, merge, *grid.shape[2:]).transpose(1, 2)
    return blocks.reshape(h * w, *grid.shape[2:])


def rotary_2d(grids: Sequence[Grid], merge: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [P, head_dim] (patch order) of the 2-D rotary: angles (row * inv, col * inv), duplicated."""
    rows, cols, device = [], [], inv_freq.device
    for t, h, w in grids:
        r, c = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
        rows.append(block_order(r, merge).repeat(t))
        cols.append(block_order(c, merge).repeat(t))
    angles = torch.cat([torch.cat(rows)[:, None] * inv_freq, torch.cat(cols)[:, None] * inv_freq], dim=-1)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotary_attention(q, k, v, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int, backend: str) -> torch.Tensor:
    """q, k, v [n, heads, d]: the rotary applied to q and k in fp32 (as HF does, whatever the
    activation dtype), then bidirectional attention inside each packed segment -> [n, heads * d]."""
    q, k = (apply_rotary(t.float(), cos, sin).to(v.dtype) for t in (q, k))
    out = varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=False, scale=q.shape[-1] ** -0.5, backend=backend)
    return out.reshape(q.shape[0], -1)


class VisionBlock(nn.Module):
    """Pre-norm: ``x += attn(norm1(x))``, ``x += mlp(norm2(x))`` (the family's modules)."""

    def __init__(self, norm1: nn.Module, norm2: nn.Module, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm1, self.norm2, self.attn, self.mlp = norm1, norm2, attn, mlp

    def forward(self, x, cos, sin, cu_seqlens, max_seqlen, backend):
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens, max_seqlen, backend)
        return x + self.mlp(self.norm2(x))
