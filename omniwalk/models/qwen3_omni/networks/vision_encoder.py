"""Qwen3-Omni vision encoder (``thinker.visual``), many images and videos packed into one call.

    pixel_values [P, C*t*p*p] (items concatenated; patches in merge-block order per frame group)
      -> patch_embed: a Linear over flattened patches (the checkpoint's Conv3d kernel == stride)
      -> + learned positions, bilinearly resampled (align_corners) from a side x side table
      -> blocks: pre-LN attention with 2-D rotary (row, col) + GELU(tanh) MLP; attention is
         bidirectional inside one frame group of one item (segments of h * w patches)
      -> after block k in deepstack_visual_indexes: merger_list[i] -> DeepStack level i
      -> merger: LayerNorm per patch, then 2x2 patches -> one token            [P / 4, out]

Parameter names mirror the checkpoint (``patch_embed.proj``, ``blocks.N.attn.qkv``,
``merger.ln_q``, ``merger.mlp.0``, ``merger_list.i.mlp.2``, ...).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.layers.attention import cu_seqlens
from omniwalk.layers.rotary import rotary_tables
from omniwalk.layers.vision import (
    Grid,
    PatchEmbed,
    VisionBlock,
    VisionOutput,
    block_order,
    rotary_2d,
    rotary_2d_inv_freq,
    rotary_attention,
)
from omniwalk.models.qwen3_omni.checkpoint.config import VisionEncoderConfig


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x, cos, sin, cu_seqlens, max_seqlen, backend):
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        return self.proj(rotary_attention(q, k, v, cos, sin, cu_seqlens, max_seqlen, backend))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class PatchMerger(nn.Module):
    """merge x merge neighbouring patches (consecutive rows) -> one token of ``out_hidden_size``.

    The final merger normalises each patch before grouping (``ln_q`` over hidden); the DeepStack
    mergers normalise the grouped vector (``ln_q`` over merge^2 * hidden).
    """

    def __init__(self, cfg: VisionEncoderConfig, norm_after_grouping: bool):
        super().__init__()
        self.grouped = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm_after_grouping = norm_after_grouping
        self.ln_q = nn.LayerNorm(self.grouped if norm_after_grouping else cfg.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.grouped, self.grouped), nn.GELU(), nn.Linear(self.grouped, cfg.out_hidden_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_after_grouping:
            return self.mlp(self.ln_q(x.reshape(-1, self.grouped)))
        return self.mlp(self.ln_q(x).reshape(-1, self.grouped))


def _axis_taps(size: int, side: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (align_corners=True) taps of ``size`` targets into ``side`` sources: idx, weight [size, 2]."""
    src = torch.arange(size, device=device, dtype=torch.float32) * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    idx = floor.long()[:, None] + torch.arange(2, device=device)
    weights = (1 - (src[:, None] - idx.float()).abs()).clamp(min=0)
    return idx.clamp(max=side - 1), weights


class VisionEncoder(nn.Module):
    """Encodes packed images/videos; see the module docstring for the pipeline."""

    def __init__(self, cfg: VisionEncoderConfig, attention_backend: str = "reference"):
        super().__init__()
        self.cfg, self.attention_backend = cfg, attention_backend
        self.patch_embed = PatchEmbed(cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        norm = functools.partial(nn.LayerNorm, cfg.hidden_size, eps=1e-6)
        self.blocks = nn.ModuleList(
            VisionBlock(norm(), norm(), VisionAttention(cfg), VisionMLP(cfg)) for _ in range(cfg.depth)
        )
        self.merger = PatchMerger(cfg, norm_after_grouping=False)
        self.merger_list = nn.ModuleList(PatchMerger(cfg, True) for _ in cfg.deepstack_visual_indexes)
        self.side = math.isqrt(cfg.num_position_embeddings)
        self.register_buffer("inv_freq", rotary_2d_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def tokens_per_item(self, grids: Sequence[Grid]) -> list[int]:
        return [t * h * w // self.cfg.spatial_merge_size**2 for t, h, w in grids]

    def segment_lengths(self, grids: Sequence[Grid]) -> list[int]:
        """The attention segments: one per frame group of every item, h * w patches each."""
        return [h * w for t, h, w in grids for _ in range(t)]

    def forward(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> VisionOutput:
        grids = [tuple(int(v) for v in g) for g in grids]
        x, cos, sin = self.embed(pixel_values, grids)
        lengths = self.segment_lengths(grids)
        main, deepstack = self.encode(x, cos, sin, cu_seqlens(lengths, x.device), max(lengths))
        return VisionOutput(main, deepstack, self.tokens_per_item(grids))

    def embed(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> tuple[torch.Tensor, ...]:
        """Patches + positions [P, hidden], and the rotary tables cos, sin [P, 1, head_dim] (fp32);
        ``grids`` of Python ints."""
        x = self.patch_embed(pixel_values)
        x = x + self._positions(grids, x.device).to(x.dtype)
        cos, sin = rotary_tables(*self._rotary(grids, x.device), torch.float32)  # applied in fp32, like HF
        return x, cos, sin

    def encode(self, x, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The blocks and the mergers over packed patches -> (tokens [P / 4, out], one such tensor
        per DeepStack level); no host reads, so it is what a CUDA graph records (over a padded
        layout, padding in whole merge groups)."""
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cu_seqlens, max_seqlen, self.attention_backend)
            if i in self.cfg.deepstack_visual_indexes:
                deepstack.append(self.merger_list[self.cfg.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack

    def _positions(self, grids: Sequence[Grid], device) -> torch.Tensor:
        """[P, hidden] learned positions resampled to each item's grid, in patch order."""
        table, out = self.pos_embed.weight, []
        for t, h, w in grids:
            hi, hw = _axis_taps(h, self.side, device)
            wi, ww = _axis_taps(w, self.side, device)
            idx = (hi[:, None, :, None] * self.side + wi[None, :, None, :]).reshape(h, w, 4)
            weight = (hw[:, None, :, None] * ww[None, :, None, :]).reshape(h, w, 4)
            grid = (table[idx] * weight[..., None].to(table.dtype)).sum(2)  # [h, w, hidden]
            out.append(block_order(grid, self.cfg.spatial_merge_size).repeat(t, 1))
        return torch.cat(out)

    def _rotary(self, grids: Sequence[Grid], device) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_2d(grids, self.cfg.spatial_merge_size, self.inv_freq.to(device))
