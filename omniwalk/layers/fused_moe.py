"""Mixture-of-experts for few tokens per expert (decode): routing in one kernel, the experts as
GEMVs that read each selected expert's weights once.

    route_topk     logits [N, E (+1)] -> weights [N, P], ids [N, P] int32, P = top_k + shared slots:
                   softmax (fp32) over the E routed experts, top-k, optional renormalisation; with
                   a shared expert folded in (``num_shared`` > 0) logit column E is its gate, and
                   slots top_k .. P-1 name experts E .. E+num_shared-1 with weight sigmoid(gate)
    expert_gate_up one program per (pair, block of intermediate rows): act = silu(gate·x) * (up·x)
    expert_down    one program per (pair, block of output columns): w * down·act, a partial sum
                   per pair [N, P, H]; the sum over pairs is left to the consumer (the decoder's
                   next fused add + RMSNorm, ``norm.RMSNorm.add``)

Rounding follows the reference (``moe.reference_experts``): gate/up outputs, silu, the product,
the expert output and its weighted value are each rounded to the activations' dtype; only the
sum over a token's experts differs (fp32 here, dtype steps in the reference's index_add).

A shared expert of width W folds in as S = ceil(W / I) experts of width I: silu(gate)·up is per
unit and the down projection sums over units, so its slices' outputs add up to the shared
expert's (the last slice padded with zero units, which add exactly nothing).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _kernels():
    # NOTE: three kernels in one builder (85 lines): Triton is imported on first use only (CPU installs
    # lack it), and the routing and both expert GEMVs share that one lazy import and cache.
    import triton
    import triton.language as tl

    @triton.jit
    def route_topk(
        logits_ptr, weights_ptr, ids_ptr, stride_l,
        E: tl.constexpr, E_PAD: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr, P_PAD: tl.constexpr,
        RENORM: tl.constexpr,
    ):  # fmt: skip
        n = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, E_PAD)
        logit = tl.load(logits_ptr + n * stride_l + e, mask=e < E, other=float("-inf")).to(tl.float32)
        prob = tl.exp(logit - tl.max(logit, 0))
        prob = prob / tl.sum(prob, 0)
        slot = tl.arange(0, P_PAD)
        picked = tl.zeros((P_PAD,), tl.float32)
        picked_ids = tl.zeros((P_PAD,), tl.int32)
        for j in tl.static_range(K):
            best = tl.argmax(prob, 0)
            picked = tl.where(slot == j, tl.max(prob, 0), picked)
            picked_ids = tl.where(slot == j, best, picked_ids)
            prob = tl.where(e == best, -1.0, prob)
        if RENORM:
            picked = picked / tl.sum(tl.where(slot < K, picked, 0.0), 0)
        dtype = weights_ptr.dtype.element_ty
        picked = picked.to(dtype)
        if SHARED > 0:
            gate = tl.load(logits_ptr + n * stride_l + E).to(tl.float32)
            shared = (1.0 / (1.0 + tl.exp(-gate))).to(dtype)
            picked = tl.where(slot >= K, shared, picked)
            picked_ids = tl.where(slot >= K, E + slot - K, picked_ids)
        valid = slot < K + SHARED
        tl.store(weights_ptr + n * (K + SHARED) + slot, picked, mask=valid)
        tl.store(ids_ptr + n * (K + SHARED) + slot, picked_ids, mask=valid)

    @triton.jit
    def expert_gate_up(
        x_ptr, w_ptr, ids_ptr, act_ptr, stride_we, stride_wr,
        H: tl.constexpr, INTER: tl.constexpr, P: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
        token = pair // P
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        rows = block * BLOCK_I + tl.arange(0, BLOCK_I)
        row_ok = rows < INTER
        gate_rows = w_ptr + expert * stride_we + rows[:, None] * stride_wr
        up_rows = gate_rows + INTER * stride_wr
        acc_gate = tl.zeros((BLOCK_I,), tl.float32)
        acc_up = tl.zeros((BLOCK_I,), tl.float32)
        for start in range(0, H, BLOCK_H):
            cols = start + tl.arange(0, BLOCK_H)
            col_ok = cols < H
            x = tl.load(x_ptr + token * H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            ok = row_ok[:, None] & col_ok[None, :]
            acc_gate += tl.sum(tl.load(gate_rows + cols[None, :], mask=ok, other=0.0).to(tl.float32) * x, 1)
            acc_up += tl.sum(tl.load(up_rows + cols[None, :], mask=ok, other=0.0).to(tl.float32) * x, 1)
        dtype = act_ptr.dtype.element_ty
        gate = acc_gate.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        act = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
        tl.store(act_ptr + pair * INTER + rows, act, mask=row_ok)

    @triton.jit
    def expert_down(
        act_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr, stride_we, stride_wr,
        H: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr,
    ):  # fmt: skip
        pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        rows = w_ptr + expert * stride_we + cols[:, None] * stride_wr
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for start in range(0, INTER, BLOCK_I):
            units = start + tl.arange(0, BLOCK_I)
            unit_ok = units < INTER
            act = tl.load(act_ptr + pair * INTER + units, mask=unit_ok, other=0.0).to(tl.float32)
            w = tl.load(rows + units[None, :], mask=col_ok[:, None] & unit_ok[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * act[None, :], 1)
        dtype = out_ptr.dtype.element_ty
        weight = tl.load(weights_ptr + pair).to(tl.float32)
        tl.store(out_ptr + pair * H + cols, (acc.to(dtype).to(tl.float32) * weight).to(dtype), mask=col_ok)

    return route_topk, expert_gate_up, expert_down


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, num_shared: int = 0, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E + (1 if num_shared else 0)] -> (weights [N, top_k + num_shared] in ``dtype``
    (default: the logits'), expert ids [N, top_k + num_shared] int32)."""
    n = logits.shape[0]
    num_experts = logits.shape[1] - (1 if num_shared else 0)
    slots = top_k + num_shared
    weights = logits.new_empty(n, slots, dtype=dtype or logits.dtype)
    ids = torch.empty(n, slots, dtype=torch.int32, device=logits.device)
    if n:
        _kernels()[0][(n,)](
            logits, weights, ids, logits.stride(0),
            E=num_experts, E_PAD=_pow2(num_experts), K=top_k, SHARED=num_shared, P_PAD=_pow2(slots),
            RENORM=renormalize,
        )  # fmt: skip
    return weights, ids


# (gate_up: rows, columns per step; down: columns, units per step; warps) of the GEMV programs: the
# best of 5 variants at 1, 8 and 32 tokens, thinker and talker shapes but one (talker at 1 token:
# 17.8 vs 19.2 µs) (benchmarks/fused_moe.py, H200, run 2: thinker layer at 1 token 35.2 µs, 53.9
# with (16, 256, 32, 128, 4))
GEMV_BLOCKS = (16, 256, 16, 256, 8)


def expert_gemv(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
    blocks: tuple[int, ...] = GEMV_BLOCKS,
) -> torch.Tensor:  # fmt: skip
    """x [N, H], gate_up [E, 2I, H], down [E, H, I], weights/ids [N, P] -> weighted expert outputs
    [N, P, H] in x's dtype (sum over P = the MoE output)."""
    n, p = ids.shape
    hidden, inter = x.shape[1], down.shape[2]
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    act = x.new_empty(n * p, inter)
    out = x.new_empty(n, p, hidden)
    if n == 0:
        return out
    _, gate_up_kernel, down_kernel = _kernels()
    rows, columns, out_columns, units, warps = blocks
    gate_up_kernel[(n * p, -(-inter // rows))](
        x, gate_up, ids, act, gate_up.stride(0), gate_up.stride(1),
        H=hidden, INTER=inter, P=p, BLOCK_I=rows, BLOCK_H=columns, num_warps=warps,
    )  # fmt: skip
    down_kernel[(n * p, -(-hidden // out_columns))](
        act, down, ids, weights, out, down.stride(0), down.stride(1),
        H=hidden, INTER=inter, BLOCK_N=out_columns, BLOCK_I=units, num_warps=warps,
    )  # fmt: skip
    return out


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
