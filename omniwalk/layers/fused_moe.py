"""Mixture-of-experts for few tokens per expert (decode): the experts as GEMVs over the (token,
expert) pairs that ``moe_routing`` chose (weights [N, P], ids [N, P]), reading each pair's expert
weights once.

    expert_gate_up one program per (pair, block of intermediate rows): act = silu(gate·x) * (up·x)
    expert_down    one program per (pair, block of output columns): w * down·act, a partial sum
                   per pair [N, P, H]; the sum over pairs is left to the consumer (the decoder's
                   next fused add + RMSNorm, ``norm.RMSNorm.add``)

Rounding follows the reference (``moe.reference_experts``): gate/up outputs, silu, the product,
the expert output and its weighted value are each rounded to the activations' dtype; the sum over
a token's experts is the consumer's, in the reference's order and steps (pairs in ascending expert
id, each sum rounded: ``norm.residual_add``).

FP8 experts (``ExpertScales``): each K step is cut into sub-blocks inside one scale column; a
sub-block's partial sum is multiplied by its scale (the e4m3 weights widened to fp32 in registers).

A shared expert of width W folds in as S = ceil(W / I) experts of width I: silu(gate)·up is per
unit and the down projection sums over units, so its slices' outputs add up to the shared
expert's (the last slice padded with zero units, which add exactly nothing).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from omniwalk.layers import pdl


@functools.cache
def _kernels():
    """-> (expert_gate_up, expert_down): their module is imported on first use (CPU installs lack Triton)."""
    from omniwalk.layers import fused_moe_triton

    return fused_moe_triton.expert_gate_up, fused_moe_triton.expert_down


# (rows of the intermediate, columns of x per step, warps) of a gate_up program and (output columns,
# units per step, warps) of a down program; spans are clipped to the next power of two of H and I,
# so a span >= that reads a whole row in one step (all loads of a program in flight at once).
# H200, benchmarks/fused_moe.py (k2 call 1), µs per kernel incl. the graph's gap, thinker/talker
# at 1 token: gate_up 14.8/5.4 (the previous (16, 256, 8): 17.9/8.6; the best thinker variant,
# (4, 1024, 4), 14.6/6.8); down 8.6/4.5 (whole rows (4, 1024, 4): 9.0/4.0, but 1.2 µs slower at 8 tokens).
# TODO: ptxas issues a program's loads in waves (sm_90a SASS of gate_up (2, 2048, 4): 7 loads, then 3
# after the first FMAs), paying DRAM latency twice; see moe_routing's NOTE. Loads feeding tl.dot go
# through the pipeliner's async copies instead (a GEMV as a dot with the tokens padded to 16 rows).
GATE_UP_BLOCKS = (2, 2048, 4)
DOWN_BLOCKS = (16, 256, 8)
# FP8 experts: the bf16 tiles. H200, benchmarks/fp8.py tune (fp8 call 2), a thinker MoE layer at 1 + 8
# tokens: gate_up (4, 2048, 4) 119 µs vs 123, down (32, 256, 8) 108 vs 119; taken together with other
# tiles the talker's step was slower (not separated), so not taken. TODO: sweep them on the talker's shapes.
GATE_UP_BLOCKS_FP8 = GATE_UP_BLOCKS
DOWN_BLOCKS_FP8 = DOWN_BLOCKS


def expert_gemv(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [N, H], gate_up [E, 2I, H], down [E, H, I], weights/ids [N, P] -> weighted expert outputs
    [N, P, H] in x's dtype (sum over P = the MoE output). FP8 experts come with their ``scales``."""
    ids = ids.contiguous()
    act = expert_gate_up(x, gate_up, ids, scales=scales)
    return expert_down(act, down, weights, ids, scales=scales)


class ExpertScales(NamedTuple):
    """The scale_inv grids of FP8 experts (``moe.FusedExperts``): gate_up [E, 2, ceil(I / bn),
    ceil(H / bk)] (gate, then up), down [E, ceil(H / bn), ceil(I / bk)], block = (bn, bk)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    block: tuple[int, int]


def expert_gate_up(
    x: torch.Tensor, gate_up: torch.Tensor, ids: torch.Tensor, blocks: tuple[int, int, int] | None = None,
    scales: ExpertScales | None = None,
) -> torch.Tensor:  # fmt: skip
    """-> act [N * P, I]: silu(gate·x) * (up·x) per (token, expert) pair."""
    blocks = blocks or (GATE_UP_BLOCKS if scales is None else GATE_UP_BLOCKS_FP8)
    n, p = ids.shape
    hidden, inter = x.shape[1], gate_up.shape[1] // 2
    x = x.contiguous()
    act = x.new_empty(n * p, inter)
    if n:
        rows, columns, warps = blocks
        s = gate_up if scales is None else scales.gate_up
        strides = (0, 0, 0) if scales is None else (s.stride(0), s.stride(1), s.stride(2))
        step = min(columns, _pow2(hidden))
        _kernels()[0][(n * p, -(-inter // rows))](
            x, gate_up, s, ids, act, gate_up.stride(0), gate_up.stride(1), *strides,
            H=hidden, INTER=inter, P=p, BLOCK_I=rows, BLOCK_H=step, **_scaling(scales), SUB_H=_sub(step, scales),
            num_warps=warps, **pdl.launch(x.device),
        )  # fmt: skip
    return act


def expert_down(
    act: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
    blocks: tuple[int, int, int] | None = None, scales: ExpertScales | None = None,
) -> torch.Tensor:  # fmt: skip
    """act [N * P, I] -> [N, P, H]: each pair's expert output times its routing weight."""
    blocks = blocks or (DOWN_BLOCKS if scales is None else DOWN_BLOCKS_FP8)
    n, p = ids.shape
    hidden, inter = down.shape[1], down.shape[2]
    out = act.new_empty(n, p, hidden)
    if n:
        columns, units, warps = blocks
        s = down if scales is None else scales.down
        strides = (0, 0) if scales is None else (s.stride(0), s.stride(1))
        step = min(units, _pow2(inter))
        _kernels()[1][(n * p, -(-hidden // columns))](
            act, down, s, ids, weights.contiguous(), out, down.stride(0), down.stride(1), *strides,
            H=hidden, INTER=inter, BLOCK_N=columns, BLOCK_I=step, **_scaling(scales), SUB_I=_sub(step, scales),
            num_warps=warps, **pdl.launch(act.device),
        )  # fmt: skip
    return out


def _scaling(scales: ExpertScales | None) -> dict:
    if scales is None:
        return dict(SCALED=False, SCALE_N=1, SCALE_K=1)
    return dict(SCALED=True, SCALE_N=scales.block[0], SCALE_K=scales.block[1])


def _sub(step: int, scales: ExpertScales | None) -> int:
    """A K step's sub-block: within one scale column (FP8), else the whole step."""
    return step if scales is None else min(step, scales.block[1])


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
