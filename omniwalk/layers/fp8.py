"""FP8 (e4m3) weights with block-wise scales: the format of Qwen's (and DeepSeek V3's) FP8 releases.

A weight W [..., N, K] is stored as ``q`` (float8_e4m3fn, same shape) and ``scale_inv`` (float32,
[..., ceil(N / bn), ceil(K / bk)]) for a block (bn, bk), normally (128, 128):

    W[n, k] ~= q[n, k] * scale_inv[n // bn, k // bk]      (dequantised = that product in fp32, exactly)

Quantising takes a block's largest magnitude to 448 (e4m3's largest finite value): scale =
448 / amax, q = clamp(W * scale) in e4m3, scale_inv = 1 / scale (an all-zero block keeps 1). Blocks
at the right and bottom edges may be partial (shapes that are not multiples of the block).

Merged projections (q/k/v, gate/up) concatenate their parts' rows; when a part's N is not a multiple
of bn the parts' grids do not line up, so ``regrid`` re-expresses scales on a finer grid (same value
per element: exact). ``Fp8Linear`` is the module a quantised nn.Linear becomes; its reference
forward dequantises to the activations' dtype (the CPU path, and the tests' oracle); on CUDA the
decoders' projections become ``SkinnyLinear``s that read the FP8 weight in the GEMM kernel.

The Triton side (the GEMVs' e4m3 widening, the one-kernel dequantize) is ``kernels/fp8.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value
DEFAULT_BLOCK = (128, 128)
Block = tuple[int, int]  # (rows, columns) of weight per scale


def grid(shape: tuple[int, ...], block: Block) -> tuple[int, ...]:
    """The scale grid of a weight of ``shape`` [..., N, K]: [..., ceil(N / bn), ceil(K / bk)]."""
    *lead, n, k = shape
    return (*lead, -(-n // block[0]), -(-k // block[1]))


def expand(scale_inv: torch.Tensor, block: Block, shape: tuple[int, ...]) -> torch.Tensor:
    """Scales [..., Gn, Gk] -> one per element [..., N, K] (partial edge blocks cropped)."""
    n, k = shape[-2:]
    return scale_inv.repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)[..., :k]


@torch.no_grad()
def quantize(w: torch.Tensor, block: Block = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] -> (q float8_e4m3fn [..., N, K], scale_inv float32 [..., ceil(N / bn), ceil(K / bk)]).
    Computed in fp32 one leading index at a time (a 3-D expert tensor never has an fp32 twin)."""
    if w.dim() > 2:
        parts = [quantize(part, block) for part in w]
        return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])
    (n, k), (bn, bk) = w.shape, block
    gn, gk = grid(w.shape, block)
    padded = F.pad(w.float(), (0, gk * bk - k, 0, gn * bn - n)).view(gn, bn, gk, bk)
    amax = padded.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    q = (padded * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(gn * bn, gk * bk)[:n, :k]
    return q.contiguous(), (1.0 / scale).float()


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: Block, dtype: torch.dtype) -> torch.Tensor:
    """q [..., N, K] -> q * scale_inv per element, computed in fp32, returned in ``dtype``."""
    (n, k), (bn, bk) = q.shape[-2:], block
    if n % bn or k % bk:
        return (q.float() * expand(scale_inv, block, q.shape)).to(dtype)
    blocks = q.float().view(*q.shape[:-2], n // bn, bn, k // bk, bk)  # (whole blocks: scales broadcast)
    return blocks.mul_(scale_inv[..., :, None, :, None]).to(dtype).view(q.shape)


def regrid(scale_inv: torch.Tensor, block: Block, finer: Block, shape: tuple[int, ...]) -> torch.Tensor:
    """The same scales on a finer grid (``finer`` divides ``block``) for a weight of ``shape``."""
    if block[0] % finer[0] or block[1] % finer[1]:
        raise ValueError(f"block {finer} does not divide {block}")
    rows = scale_inv.repeat_interleave(block[0] // finer[0], -2)
    cols = rows.repeat_interleave(block[1] // finer[1], -1)
    gn, gk = grid(shape, finer)[-2:]
    return cols[..., :gn, :gk].contiguous()


def concat_rows(
    parts: list[tuple[torch.Tensor, torch.Tensor]], block: Block
) -> tuple[torch.Tensor, torch.Tensor, Block]:
    """(q, scale_inv) parts stacked along rows -> (q, scale_inv, block) of the merged weight; the
    row block shrinks to gcd(bn, each part's rows but the last) where the parts' grids do not meet."""
    bn = math.gcd(block[0], *(q.shape[-2] for q, _ in parts[:-1]))
    finer = (bn, block[1])
    scales = [regrid(s, block, finer, q.shape) for q, s in parts]
    return torch.cat([q for q, _ in parts], -2), torch.cat(scales, -2), finer


class ExpertScales(NamedTuple):
    """The scale_inv grids of FP8 experts (``moe.FusedExperts``): gate_up [E, 2, ceil(I / bn),
    ceil(H / bk)] (gate, then up), down [E, ceil(H / bn), ceil(I / bk)], block = (bn, bk)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    block: tuple[int, int]


class Fp8Linear(nn.Module):
    """A bias-free Linear with an FP8 ``weight`` [N, K] and its ``weight_scale_inv`` (the checkpoint's
    names). ``forward`` dequantises to the input's dtype and multiplies: the reference path."""

    def __init__(self, weight: torch.Tensor, scale_inv: torch.Tensor, block: Block):
        super().__init__()
        if weight.dtype != FP8 or tuple(scale_inv.shape) != grid(weight.shape, block):
            raise ValueError(f"Fp8Linear wants {FP8} weights and a {grid(weight.shape, block)} scale grid")
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale_inv, requires_grad=False)
        self.block = block

    @classmethod
    def from_linear(cls, linear: nn.Linear, block: Block = DEFAULT_BLOCK) -> Fp8Linear:
        if linear.bias is not None:
            raise ValueError("Fp8Linear has no bias")
        return cls(*quantize(linear.weight.data, block), block)

    @classmethod
    def empty(cls, linear: nn.Linear, block: Block) -> Fp8Linear:
        """Uninitialised FP8 storage for ``linear``'s weight (to be filled from an FP8 checkpoint)."""
        w = linear.weight
        return cls(
            torch.empty(w.shape, dtype=FP8, device=w.device),
            w.new_empty(grid(w.shape, block), dtype=torch.float32),
            block,
        )

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.weight, self.weight_scale_inv, self.block, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, block={self.block}"
