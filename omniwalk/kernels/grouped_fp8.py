"""Grouped GEMM of FP8 experts over expert-sorted (token, expert) pairs: the fused MoE backend's
path past the expert GEMVs (many pairs: B = 32 decode steps, prefill) when the experts are FP8.

Both operands are e4m3 and multiply on FP8 tensor cores (w8a8): the activations are quantised per
row and group of columns as the weights are per block (a group's largest magnitude to 448,
``fp8.quantize(x, (1, group))`` exactly; x in groups of ``GROUP``, silu(gate) * up in groups of
gate_up's output tile), and each K step (a group) is scaled by its row's and its weight block's
scales. The activations' rounding is this path's alone: the expert GEMVs (decode at few pairs) and
the reference backend multiply the activations as they are, so outputs here differ from the
reference by e4m3's rounding of x and of silu(gate) * up (of the order of the weights' own rounding)
besides the weights'. Multiplying on FP8 tensor cores is faster than widening each e4m3 tile to bf16
in registers before ``tl.dot`` (and than the bf16 grouped GEMM; docs/performance.md).

Pairs are sorted by expert (``moe_routing.sort_pairs``, on the device: no host reads); ``ends[e]``
is where expert e's rows end. One program per (expert, block of output columns) walks that
expert's rows in tiles of ``BLOCK_M``: each weight tile is read once per row tile (from HBM for the
first, L2 when it still holds it). Programs of experts without rows exit at once.

    quantize_rows  x [T, H] -> e4m3 [T, H] + scales [T, H / GROUP]
    gate_up        token rows (gathered through the pairs' tokens) -> silu(gate) * up [P, I], rounded
                   like ``expert_gate_up`` then quantised (a group per program's block of columns)
    down           act [P, I] -> [P, H] in the activations' dtype

The routing weight and the return to pair order follow ``fused_moe.grouped_experts``.

Launch configurations by the pairs' tile rows (16 while experts get few pairs, decode; 64 beyond):
(rows, output columns, warps, stages), from the device's tuned file
(``configs/grouped_fp8,device_name=<GPU>.json``), else ``GATE_UP_BLOCKS`` / ``DOWN_BLOCKS``. gate_up's
columns are also the down GEMM's activation group and K step; its two fp32 accumulators want 8 warps
at 64 x 128 (4 spill; ``tests/kernels/test_gemv_spills.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from omniwalk.kernels import tuned
from omniwalk.kernels.moe_routing import pow2, sort_pairs, unsort_pairs
from omniwalk.layers.fp8 import FP8, ExpertScales

GROUP = 128  # activation columns per scale (capped by the weights' K block, which it must divide)
# where the device has no tuned file: by the pairs' tile rows, (rows, output columns, warps, stages)
GATE_UP_BLOCKS = {16: (16, 128, 4, 4), 64: (64, 128, 8, 4)}
DOWN_BLOCKS = {16: (16, 64, 4, 3), 64: (64, 128, 4, 4)}


def grouped_blocks(projection: str, size: int, device) -> tuple[int, int, int, int]:
    """(rows, output columns, warps, stages) of ``projection`` ("gate_up", "down") at tile rows ``size``."""
    entry = tuned.configs("grouped_fp8", tuned.device_of(device)).get(f"{projection},rows={size}")
    if entry is None:
        return (GATE_UP_BLOCKS if projection == "gate_up" else DOWN_BLOCKS)[size]
    return entry["rows"], entry["columns"], entry["warps"], entry["stages"]


def _round_type(dtype: torch.dtype):
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
        quantize_rows_kernel[(t,)](
            x,
            q,
            scale_inv,
            k,
            x.stride(0),
            q.stride(0),
            scale_inv.stride(0),
            GROUP=group,
            GROUPS=pow2(groups),
            GROUP_PAD=pow2(group),
        )
    return Quantized(q, scale_inv, group)


def activation_group(block: tuple[int, int], group: int = GROUP) -> int:
    """Columns per activation scale for weights of scale ``block``: ``group``, or the weights' K block where
    smaller (blocks are powers of two, ``checkpoint_block``: either divides the other, so each K step of
    ``group`` columns has one weight scale)."""
    return min(group, block[1])


def grouped_gemm(
    rows: Quantized,
    tokens: torch.Tensor | None,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    ends: torch.Tensor,
    dtype: torch.dtype,
) -> Quantized | torch.Tensor:
    """Quantised rows (K steps of ``rows.group``) and FP8 weight [E, N (gated: 2I), K] with its scale grid,
    over P pairs sorted by expert (expert e's end at ``ends[e]``) -> gated (``tokens``: pair i reads row
    ``tokens[i]``): silu(gate) * up quantised [P, I] (a group per program's columns); otherwise (pair i
    reads row i) [P, N] in ``dtype``."""
    gated = tokens is not None
    p, k = (tokens.shape[0] if gated else rows.q.shape[0]), rows.q.shape[1]
    n = weight.shape[1] // 2 if gated else weight.shape[1]
    size = 16 if p <= 8 * weight.shape[0] else 64
    tile_m, tile_n, warps, stages = grouped_blocks("gate_up" if gated else "down", size, rows.q.device)
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
        grouped_kernel[(weight.shape[0], -(-n // tile_n))](
            rows.q,
            rows.scale_inv,
            tokens if gated else ends,
            weight,
            scale,
            ends,
            out,
            out_scale,
            n,
            k,
            rows.q.stride(0),
            rows.scale_inv.stride(0),
            weight.stride(0),
            weight.stride(1),
            *strides,
            out.stride(0),
            out_scale.stride(0),
            BLOCK_M=tile_m,
            BLOCK_N=tile_n,
            BLOCK_K=rows.group,
            GATED=gated,
            SCALE_N=block[0],
            SCALE_K=block[1],
            ROUND=_round_type(dtype),
            num_warps=warps,
            num_stages=stages,
        )
    return Quantized(out, out_scale, tile_n) if gated else out


def grouped_fp8_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    scales: ExpertScales,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """``fused_moe.grouped_experts`` for FP8 experts: -> [N, k, H] weighted per-pair outputs."""
    num_tokens, top_k = ids.shape
    pairs, block = sort_pairs(ids, weights, gate_up.shape[0]), scales.block
    act = grouped_gemm(
        quantize_rows(x, activation_group(block)), pairs.tokens, gate_up, scales.gate_up, block, pairs.ends, x.dtype
    )
    y = grouped_gemm(act, None, down, scales.down, block, pairs.ends, x.dtype)
    return unsort_pairs(y, pairs).view(num_tokens, top_k, x.shape[1])


FP8_MAX = tl.constexpr(448.0)  # (fp8.FP8_MAX)


@triton.jit
def _quantize(x):
    """fp32 tile [R, G] -> (values to store as e4m3, clamped; scale_inv [R]): each row's largest magnitude
    to 448, as ``fp8.quantize`` computes a block's (an all-zero row keeps scale 1)."""
    amax = tl.max(tl.abs(x), 1)
    # 448 / amax as torch computes a number over a tensor: the reciprocal (rounded once: ``div_rn``, where
    # ``/`` is the GPU's approximate division), then the product
    one = tl.full(amax.shape, 1.0, tl.float32)
    scale = tl.where(amax > 0, tl.math.div_rn(one, tl.where(amax > 0, amax, 1.0)) * FP8_MAX, 1.0)
    return tl.clamp(x * scale[:, None], -FP8_MAX, FP8_MAX), tl.math.div_rn(one, scale)


@triton.jit
def quantize_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    K,
    stride_x,
    stride_q,
    stride_s,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP_PAD: tl.constexpr,
):
    """Row ``program_id`` of x, each GROUP columns with their own scale -> e4m3 row and scales."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.arange(0, GROUPS)
    inner = tl.arange(0, GROUP_PAD)
    cols = groups[:, None] * GROUP + inner[None, :]
    ok = (inner < GROUP)[None, :] & (cols < K)
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    q, scale_inv = _quantize(x)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_s + groups, scale_inv, mask=groups * GROUP < K)


@triton.jit
def grouped_kernel(
    a_ptr,
    a_s_ptr,
    tokens_ptr,
    w_ptr,
    s_ptr,
    ends_ptr,
    out_ptr,
    out_s_ptr,
    N,
    K,
    stride_am,
    stride_asm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sh,
    stride_sn,
    stride_om,
    stride_osm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    ROUND: tl.constexpr,
):
    """Program (expert, block of BLOCK_N output columns) over that expert's rows, BLOCK_M at a time.
    Rows are e4m3 with a scale per BLOCK_K columns (``a_s``); gated, row i is token ``tokens[i]``'s."""
    expert, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start = tl.load(ends_ptr + tl.maximum(expert - 1, 0)) * (expert > 0)
    end = tl.load(ends_ptr + expert)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    gate_rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn  # (GATED: up rows start N further)
    gate_scales = s_ptr + expert * stride_se + (cols // SCALE_N) * stride_sn  # (up: + stride_sh)
    for m0 in range(start, end, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        m_ok = ms < end
        rows = tl.load(tokens_ptr + ms, mask=m_ok, other=0).to(tl.int64) if GATED else ms.to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            a_s = tl.load(a_s_ptr + rows * stride_asm + k0 // BLOCK_K, mask=m_ok, other=0.0)
            ok = col_ok[:, None] & k_ok[None, :]
            w = tl.load(gate_rows + ks[None, :], mask=ok, other=0.0)
            s = tl.load(gate_scales + k0 // SCALE_K, mask=col_ok, other=0.0)
            acc += tl.dot(a, tl.trans(w)) * (a_s[:, None] * s[None, :])
            if GATED:
                w_up = tl.load(gate_rows + N * stride_wn + ks[None, :], mask=ok, other=0.0)
                s_up = tl.load(gate_scales + stride_sh + k0 // SCALE_K, mask=col_ok, other=0.0)
                acc_up += tl.dot(a, tl.trans(w_up)) * (a_s[:, None] * s_up[None, :])
        out_ok = m_ok[:, None] & col_ok[None, :]
        if GATED:  # silu(gate) * up rounded as ``expert_gate_up`` rounds it, then quantised for the down GEMM
            gate = acc.to(ROUND).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(ROUND).to(tl.float32)
            act = (silu * acc_up.to(ROUND).to(tl.float32)).to(ROUND).to(tl.float32)
            q, scale_inv = _quantize(tl.where(out_ok, act, 0.0))
            tl.store(out_ptr + ms[:, None] * stride_om + cols[None, :], q.to(out_ptr.dtype.element_ty), mask=out_ok)
            tl.store(out_s_ptr + ms * stride_osm + block, scale_inv, mask=m_ok)
        else:
            tl.store(out_ptr + ms[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_ok)
