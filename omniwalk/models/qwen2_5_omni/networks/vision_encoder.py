"""Qwen2.5-Omni vision encoder (``thinker.visual``, Qwen2.5-VL's), many images and videos packed.

    pixel_values [P, C*t*p*p] (items concatenated; patches in merge-block order per frame group)
      -> patch_embed: a Linear over flattened patches (the checkpoint's bias-free Conv3d)
      -> reordered window by window (below); 2-D rotary (row, col) tables reordered alike
      -> blocks: RMSNorm, attention (q/k/v with bias, rotary in fp32), RMSNorm, SwiGLU MLP;
         attention is bidirectional inside one window (window blocks) or one frame group of one
         item (the blocks at ``fullatt_block_indexes``): two varlen patterns over the same order
      -> merger: RMSNorm per patch, 2x2 patches -> one token, MLP; back to patch order [P / 4, out]

Windows: each frame group's merged grid (h/2 x w/2 tokens) is cut into squares of
``window_tokens`` tokens a side (ragged at the right and bottom edges), in raster order, tokens
raster-ordered inside; a window's segment is its tokens' patches. A frame group stays contiguous
in this order, so the full-attention segments are the frame groups, as in patch order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.device import to_device
from omniwalk.layers.attention import cu_seqlens
from omniwalk.layers.linear import MergesProjections, stacked_linear
from omniwalk.layers.norm import RMSNorm
from omniwalk.layers.rotary import rotary_tables
from omniwalk.layers.vision import (
    Grid,
    PatchEmbed,
    VisionBlock,
    VisionOutput,
    rotary_2d,
    rotary_2d_inv_freq,
    rotary_attention,
)
from omniwalk.models.qwen2_5_omni.checkpoint.config import VisionEncoderConfig


class VisionAttention(MergesProjections):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q, self.k, self.v, self.proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.qkv: nn.Linear | None = None  # the fast path's merged projection (``merge_projections``)

    def merge_projections(self) -> None:
        """Fused kernels (``decoder.use_fused_kernels``, after loading): q/k/v in one biased GEMM."""
        parts = (self.q, self.k, self.v)
        self.qkv = stacked_linear([p.weight for p in parts], [p.bias for p in parts])
        del self.q, self.k, self.v

    def forward(self, x, cos, sin, cu_seqlens, max_seqlen, backend):
        n = x.shape[0]
        if self.qkv is not None:
            q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        else:
            q, k, v = (proj(x).view(n, self.num_heads, self.head_dim) for proj in (self.q, self.k, self.v))
        return self.proj(rotary_attention(q, k, v, cos, sin, cu_seqlens, max_seqlen, backend))


class VisionMLP(MergesProjections):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.gate_up: nn.Linear | None = None  # the fused kernels' merged, padded projection (``merge_projections``)
        self.silu_mul = None  # and their silu·mul (``kernels/silu_mul.py``)

    def merge_projections(self) -> None:
        """Fused kernels (``decoder.use_fused_kernels``, after loading): gate and up in one biased GEMM,
        silu·mul one kernel, the intermediate width zero-padded to a multiple of ``ALIGN``. The 7B's 3,420
        (not a multiple of 8 bf16 values) sends cuBLAS to an sm80 kernel, a large share of an image's
        encode (docs/performance.md). Padded columns give silu(0)·0 = 0 and meet zero down-projection
        columns: the same sums."""
        from omniwalk.kernels.silu_mul import silu_mul_triton

        self.silu_mul = silu_mul_triton
        pad = -self.gate_proj.out_features % ALIGN
        parts = (self.gate_proj, self.up_proj)
        self.gate_up = stacked_linear(
            [F.pad(p.weight, (0, 0, 0, pad)) for p in parts], [F.pad(p.bias, (0, pad)) for p in parts]
        )
        self.down_proj = stacked_linear([F.pad(self.down_proj.weight, (0, pad))], [self.down_proj.bias])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            return self.down_proj(self.silu_mul(self.gate_up(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


ALIGN = 64  # the merged MLP's intermediate width: a multiple of this (3,420 -> 3,456: cuBLAS's Hopper kernels)


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig):
        super().__init__()
        self.grouped = cfg.hidden_size * cfg.spatial_merge_size**2
        self.ln_q = RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(self.grouped, self.grouped), nn.GELU(), nn.Linear(self.grouped, cfg.out_hidden_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).reshape(-1, self.grouped))


@dataclass
class WindowLayout:
    """A packed call's window order: ``tokens`` [P / 4] merged-token index of each position in
    window order; segment lengths (in patches) of the windows and of the frame groups."""

    tokens: torch.Tensor
    windows: list[int]
    frames: list[int]


def window_layout(grids: Sequence[Grid], merge: int, side: int) -> WindowLayout:
    """See the module docstring; ``side`` = merged tokens per window side."""
    order, windows, frames, offset = [], [], [], 0
    for t, h, w in grids:
        lh, lw = h // merge, w // merge
        grid = torch.arange(t * lh * lw).view(t, lh, lw) + offset
        for frame in grid:
            frames.append(lh * lw * merge**2)
            for r in range(0, lh, side):
                for c in range(0, lw, side):
                    block = frame[r : r + side, c : c + side].reshape(-1)
                    order.append(block)
                    windows.append(block.numel() * merge**2)
        offset += t * lh * lw
    return WindowLayout(torch.cat(order), windows, frames)


class VisionEncoder(nn.Module):
    """Encodes packed images/videos; see the module docstring for the pipeline."""

    def __init__(self, cfg: VisionEncoderConfig, attention_backend: str = "reference"):
        super().__init__()
        self.cfg, self.attention_backend = cfg, attention_backend
        self.patch_embed = PatchEmbed(cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, False)
        h = cfg.hidden_size
        self.blocks = nn.ModuleList(
            VisionBlock(RMSNorm(h), RMSNorm(h), VisionAttention(cfg), VisionMLP(cfg)) for _ in range(cfg.depth)
        )
        self.merger = PatchMerger(cfg)
        self.register_buffer("inv_freq", rotary_2d_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def tokens_per_item(self, grids: Sequence[Grid]) -> list[int]:
        return [t * h * w // self.cfg.spatial_merge_size**2 for t, h, w in grids]

    def forward(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> VisionOutput:
        grids = [tuple(int(v) for v in g) for g in grids]
        x, cos, sin, layout = self.embed(pixel_values, grids)
        return self.finish(self.layers(x, cos, sin, layout), layout, grids)

    def layers(self, x, cos, sin, layout: WindowLayout, replay_run: Callable | None = None) -> torch.Tensor:
        """Every block: the runs of window-attention blocks (``window_runs``; ``replay_run(i, x)`` runs the
        i-th where given, e.g. from a CUDA graph) and the full-attention block after each."""
        windows = cu_seqlens(layout.windows, x.device), max(layout.windows)
        frames = cu_seqlens(layout.frames, x.device), max(layout.frames)  # (contiguous in window order)
        for i, (first, last) in enumerate(self.window_runs()):
            if replay_run is None:
                x = self.window_blocks(x, cos, sin, *windows, first=first, last=last)
            else:
                x = replay_run(i, x)
            if last < self.cfg.depth:
                x = self.blocks[last](x, cos, sin, *frames, self.attention_backend)
        return x

    def embed(self, pixel_values: torch.Tensor, grids: Sequence[Grid]):
        """Patches [P, hidden] and the rotary tables cos, sin [P, 1, head_dim] (fp32) in window order,
        and the call's ``WindowLayout``; ``grids`` of Python ints."""
        merge = self.cfg.spatial_merge_size
        layout = window_layout(grids, merge, self.cfg.window_tokens)
        tokens = to_device(layout.tokens, pixel_values.device)
        patches = (tokens[:, None] * merge**2 + torch.arange(merge**2, device=tokens.device)).reshape(-1)
        x = self.patch_embed(pixel_values)[patches]
        cos, sin = rotary_tables(*rotary_2d(grids, merge, self.inv_freq.to(x.device)), torch.float32)
        return x, cos[patches], sin[patches], WindowLayout(tokens, layout.windows, layout.frames)

    def window_runs(self) -> list[tuple[int, int]]:
        """The blocks as runs [first, last) of window-attention blocks, each run followed by the
        full-attention block ``last`` (the last run by none when the final block is a window block)."""
        runs, first = [], 0
        for i in (*sorted(self.cfg.fullatt_block_indexes), self.cfg.depth):
            runs.append((first, i))
            first = i + 1
        return [(a, b) for a, b in runs if b > a or b < self.cfg.depth]

    def window_blocks(self, x, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int, *, first: int, last: int):
        """Blocks [first, last) over the windows (all window-attention blocks): no host reads, so a run
        is what a CUDA graph records (over a padded layout of windows)."""
        for block in self.blocks[first:last]:
            x = block(x, cos, sin, cu_seqlens, max_seqlen, self.attention_backend)
        return x

    def finish(self, x: torch.Tensor, layout: WindowLayout, grids: Sequence[Grid]) -> VisionOutput:
        """The merger, and its tokens back in patch order."""
        merged = torch.empty_like(out := self.merger(x)).index_copy_(0, layout.tokens, out)
        return VisionOutput(merged, [], self.tokens_per_item(grids))
