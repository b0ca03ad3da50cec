"""Grouped GEMM of FP8 experts over expert-sorted (token, expert) pairs: the fused MoE backend's
path past the expert GEMVs (many pairs: B = 32 decode steps, prefill) when the experts are FP8.

Pairs are sorted by expert (as ``moe.grouped_experts`` sorts them, on the device: no host reads);
``ends[e]`` is where expert e's rows end. One program per (expert, block of output columns) walks
that expert's rows in tiles of ``BLOCK_M``: each weight tile is read once per row tile (from HBM
for the first, L2 after), widened from e4m3 to the activations' dtype in registers, multiplied on
tensor cores, and its K block's scale applied to the partial product (``BLOCK_K`` divides the
scale block). Programs of experts without rows exit at once.

    gate_up  rows [P, H] -> silu(gate) * up [P, I], rounded like ``expert_gate_up``
    down     act [P, I] -> [P, H] in the activations' dtype

The routing weight and the return to pair order follow ``moe.grouped_experts``.
"""

from __future__ import annotations

import functools

import torch

from omniwalk.layers.fused_moe import ExpertScales
from omniwalk.layers.moe_routing import sort_pairs, unsort_pairs

# (rows per tile, output columns per program, warps, stages); rows: 16 while experts get few rows
# (decode), 64 beyond. H200, benchmarks/fp8.py tune (fp8 call 2), a thinker MoE layer at 32 tokens
# (256 pairs): (16, 32, 4, 3) 253 µs, (16, 64, 4, 3) 268, (16, 128, 4, 3) 278; FP8 expert GEMVs 350
# (call 1), bf16 grouped GEMM 443. The 64-row tile is not measured.
BLOCKS = {16: (16, 32, 4, 3), 64: (64, 64, 4, 3)}


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def grouped(
        x_ptr, w_ptr, s_ptr, ends_ptr, out_ptr, N, K, stride_xm, stride_we, stride_wn, stride_se, stride_sh,
        stride_sn, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GATED: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
    ):  # fmt: skip
        expert, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
        start = tl.load(ends_ptr + tl.maximum(expert - 1, 0)) * (expert > 0)
        end = tl.load(ends_ptr + expert)
        cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        gate_rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn  # (GATED: up rows start N further)
        gate_scales = s_ptr + expert * stride_se + (cols // SCALE_N)[:, None] * stride_sn  # (up: + stride_sh)
        dtype = out_ptr.dtype.element_ty
        for m0 in range(start, end, BLOCK_M):
            ms = m0 + tl.arange(0, BLOCK_M)
            m_ok = ms < end
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < K
                x_tile = x_ptr + ms[:, None] * stride_xm + ks[None, :]
                x = tl.load(x_tile, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                ok = col_ok[:, None] & k_ok[None, :]
                w = tl.load(gate_rows + ks[None, :], mask=ok, other=0.0).to(x.dtype)
                s = tl.load(gate_scales + k0 // SCALE_K, mask=col_ok[:, None], other=0.0)
                acc += tl.dot(x, tl.trans(w)) * tl.trans(s)
                if GATED:
                    w_up = tl.load(gate_rows + N * stride_wn + ks[None, :], mask=ok, other=0.0).to(x.dtype)
                    s_up = tl.load(gate_scales + stride_sh + k0 // SCALE_K, mask=col_ok[:, None], other=0.0)
                    acc_up += tl.dot(x, tl.trans(w_up)) * tl.trans(s_up)
            if GATED:
                gate = acc.to(dtype).to(tl.float32)
                silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
                acc = silu * acc_up.to(dtype).to(tl.float32)
            out = out_ptr + ms[:, None] * stride_om + cols[None, :]
            tl.store(out, acc.to(dtype), mask=m_ok[:, None] & col_ok[None, :])

    return grouped


def grouped_gemm(
    rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], ends: torch.Tensor,
    gated: bool,
) -> torch.Tensor:  # fmt: skip
    """rows [P, K] sorted by expert (expert e's rows end at ``ends[e]``), FP8 weight [E, N (2I), K]
    with its scale grid -> [P, N] (gated: silu(gate) * up [P, I])."""
    p, k = rows.shape
    n = weight.shape[1] // 2 if gated else weight.shape[1]
    out = rows.new_empty(p, n)
    if p:
        tile_m, tile_n, warps, stages = BLOCKS[16 if p <= 8 * weight.shape[0] else 64]
        # (scales: gate_up [E, 2, rows, cols], down [E, rows, cols])
        strides = scale.stride()[:3] if gated else (scale.stride(0), 0, scale.stride(1))
        _kernel()[(weight.shape[0], -(-n // tile_n))](
            rows, weight, scale, ends, out, n, k, rows.stride(0), weight.stride(0), weight.stride(1), *strides,
            out.stride(0), BLOCK_M=tile_m, BLOCK_N=tile_n, BLOCK_K=min(128, block[1]), GATED=gated,
            SCALE_N=block[0], SCALE_K=block[1], num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out


def grouped_fp8_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, scales: ExpertScales, weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``moe.grouped_experts`` for FP8 experts: -> [N, k, H] weighted per-pair outputs."""
    num_tokens, top_k = ids.shape
    pairs = sort_pairs(ids, weights, gate_up.shape[0])
    act = grouped_gemm(x.index_select(0, pairs.tokens), gate_up, scales.gate_up, scales.block, pairs.ends, gated=True)
    y = grouped_gemm(act, down, scales.down, scales.block, pairs.ends, gated=False)
    return unsort_pairs(y, pairs).view(num_tokens, top_k, x.shape[1])
