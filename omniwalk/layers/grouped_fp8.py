"""Grouped GEMM of FP8 experts over expert-sorted (token, expert) pairs: the fused MoE backend's
path past the expert GEMVs (many pairs: B = 32 decode steps, prefill) when the experts are FP8.

Both operands are e4m3 and multiply on FP8 tensor cores (w8a8): the activations are quantised per
row and group of columns as the weights are per block (a group's largest magnitude to 448,
``fp8.quantize(x, (1, group))`` exactly; x in groups of ``GROUP``, silu(gate) * up in groups of
gate_up's output tile), and each K step (a group) is scaled by its row's and its weight block's
scales. The activations' rounding is this path's alone: the expert GEMVs (decode at few pairs) and
the reference backend multiply the activations as they are, so outputs here differ from the
reference by e4m3's rounding of x and of silu(gate) * up (~2.6% of a value, RMS, as the weights'
rounding measured in session 26) besides the weights'. The weight-only kernel it replaced widened
each e4m3 tile to bf16 in registers before ``tl.dot``: a thinker MoE layer at a 1,024-token prefill
chunk took 762 µs with it, 430 with this one, 560 in bf16 (H200, docs/perf.md, session 35).

Pairs are sorted by expert (``moe_routing.sort_pairs``, on the device: no host reads); ``ends[e]``
is where expert e's rows end. One program per (expert, block of output columns) walks that
expert's rows in tiles of ``BLOCK_M``: each weight tile is read once per row tile (from HBM for the
first, L2 when it still holds it). Programs of experts without rows exit at once.

    quantize_rows  x [T, H] -> e4m3 [T, H] + scales [T, H / GROUP]
    gate_up        token rows (gathered through the pairs' tokens) -> silu(gate) * up [P, I], rounded
                   like ``expert_gate_up`` then quantised (a group per program's block of columns)
    down           act [P, I] -> [P, H] in the activations' dtype

The routing weight and the return to pair order follow ``moe.grouped_experts``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from omniwalk.layers.fp8 import FP8
from omniwalk.layers.fused_moe import ExpertScales
from omniwalk.layers.moe_routing import pow2, sort_pairs, unsort_pairs

GROUP = 128  # activation columns per scale (capped by the weights' K block, which it must divide)
# Launch configurations by the pairs' tile rows: 16 while experts get few pairs (decode), 64 beyond: (rows, output
# columns, warps, stages). gate_up's columns are also the down GEMM's activation group and K step (two fp32
# accumulators: at 64 x 128, 4 warps take 255 registers + 488 bytes of stack a thread, 8 warps 245 and none: the
# sm_90a build, compiled on the CPU as ``benchmarks/fp8_sass.py`` compiles). H200, a thinker MoE layer, each table
# tuned with the other in place (session 35 call 2, ``benchmarks/fp8.py --parts tune --tune-rows 32``; gate_up's
# columns 128 then): at 32 tokens 168 µs (the weight-only kernel before: 209; bf16's grouped GEMM 399); at 1,024
# tokens 430 µs (before: 762; bf16 560); 4-warp gate_up tiles at 64 x 128 570-770 µs. Call 3 (gate_up's columns
# tuned too): 128 x 64 gate_up tiles 486 µs, 64 x 64 461-499; down (64, 128, 4, 4) 426.8 (within noise of (64,
# 128, 4, 3)).
GATE_UP_BLOCKS = {16: (16, 128, 4, 4), 64: (64, 128, 8, 4)}
DOWN_BLOCKS = {16: (16, 64, 4, 3), 64: (64, 128, 4, 4)}


@functools.cache
def _kernels():
    """The kernels' module (``quantize_rows``, ``grouped``), imported on first use (CPU installs lack Triton)."""
    from omniwalk.layers import grouped_fp8_triton

    return grouped_fp8_triton


def _round_type(dtype: torch.dtype):
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


class Quantized(NamedTuple):
    """Activations in e4m3: q [R, K], scale_inv [R, ceil(K / group)] (a scale per row and ``group`` columns)."""

    q: torch.Tensor
    scale_inv: torch.Tensor
    group: int


def quantize_rows(x: torch.Tensor, group: int) -> Quantized:
    """x [T, K] -> e4m3 per row and ``group`` columns in one kernel: ``fp8.quantize(x, (1, group))``'s values."""
    t, k = x.shape
    groups = -(-k // group)
    q = torch.empty(t, k, dtype=FP8, device=x.device)
    scale_inv = torch.empty(t, groups, dtype=torch.float32, device=x.device)
    if t:
        _kernels().quantize_rows[(t,)](
            x, q, scale_inv, k, x.stride(0), q.stride(0), scale_inv.stride(0), GROUP=group,
            GROUPS=pow2(groups), GROUP_PAD=pow2(group),
        )  # fmt: skip
    return Quantized(q, scale_inv, group)


def activation_group(block: tuple[int, int], group: int = GROUP) -> int:
    """Columns per activation scale for weights of scale ``block``: ``group``, or the weights' K block where
    smaller (blocks are powers of two, ``checkpoint_block``: either divides the other, so each K step of
    ``group`` columns has one weight scale)."""
    return min(group, block[1])


def grouped_gemm(
    rows: Quantized, tokens: torch.Tensor | None, weight: torch.Tensor, scale: torch.Tensor,
    block: tuple[int, int], ends: torch.Tensor, dtype: torch.dtype,
) -> Quantized | torch.Tensor:  # fmt: skip
    """Quantised rows (K steps of ``rows.group``) and FP8 weight [E, N (gated: 2I), K] with its scale grid,
    over P pairs sorted by expert (expert e's end at ``ends[e]``) -> gated (``tokens``: pair i reads row
    ``tokens[i]``): silu(gate) * up quantised [P, I] (a group per program's columns); otherwise (pair i
    reads row i) [P, N] in ``dtype``."""
    gated = tokens is not None
    p, k = (tokens.shape[0] if gated else rows.q.shape[0]), rows.q.shape[1]
    n = weight.shape[1] // 2 if gated else weight.shape[1]
    size = 16 if p <= 8 * weight.shape[0] else 64
    tile_m, tile_n, warps, stages = (GATE_UP_BLOCKS if gated else DOWN_BLOCKS)[size]
    if gated:
        tile_n = activation_group(block, tile_n)
        out = torch.empty(p, n, dtype=FP8, device=rows.q.device)
        out_scale = torch.empty(p, -(-n // tile_n), dtype=torch.float32, device=rows.q.device)
    else:
        out = torch.empty(p, n, dtype=dtype, device=rows.q.device)
        out_scale = out  # (unused)
    if p:
        # (scales: gate_up [E, 2, rows, cols], down [E, rows, cols])
        strides = scale.stride()[:3] if gated else (scale.stride(0), 0, scale.stride(1))
        _kernels().grouped[(weight.shape[0], -(-n // tile_n))](
            rows.q, rows.scale_inv, tokens if gated else ends, weight, scale, ends, out, out_scale, n, k,
            rows.q.stride(0), rows.scale_inv.stride(0), weight.stride(0), weight.stride(1), *strides, out.stride(0),
            out_scale.stride(0), BLOCK_M=tile_m, BLOCK_N=tile_n, BLOCK_K=rows.group, GATED=gated,
            SCALE_N=block[0], SCALE_K=block[1], ROUND=_round_type(dtype), num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return Quantized(out, out_scale, tile_n) if gated else out


def grouped_fp8_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, scales: ExpertScales, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``moe.grouped_experts`` for FP8 experts: -> [N, k, H] weighted per-pair outputs."""
    num_tokens, top_k = ids.shape
    pairs, block = sort_pairs(ids, weights, gate_up.shape[0]), scales.block
    act = grouped_gemm(quantize_rows(x, activation_group(block)), pairs.tokens, gate_up, scales.gate_up, block,
                       pairs.ends, x.dtype)  # fmt: skip
    y = grouped_gemm(act, None, down, scales.down, block, pairs.ends, x.dtype)
    return unsort_pairs(y, pairs).view(num_tokens, top_k, x.shape[1])
