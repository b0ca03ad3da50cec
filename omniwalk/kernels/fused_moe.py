"""The fused mixture-of-experts (the registry entry ``moe_backend="fused"``, ``FUSED_MOE``): routing in
one kernel (``moe_routing``); while the (token, expert) pairs are few (decode: at most
``layers/moe.MAX_GEMV_PAIRS``) the router GEMV is folded into it (``route_folded``) and expert GEMVs read
each selected expert once and return per-pair partials (summed by the decoder's next add + RMSNorm);
beyond that the router is a GEMM (``route_topk`` on its logits) and the experts a grouped GEMM over
expert-sorted pairs (``grouped_experts``; FP8 experts: ``grouped_fp8``), where tensor-core tiles are
full enough. A shared expert is folded in as extra experts once the weights are loaded
(``FusedMoE.prepare``: ``SparseMoE.fold_shared_expert``).

The expert GEMVs, over the pairs that ``moe_routing`` chose (weights [N, P], ids [N, P]):

    expert_gate_up one program per (pair, block of intermediate rows): act = silu(gate·x) * (up·x)
    expert_down    one program per (pair, block of output columns): w * down·act, a partial sum
                   per pair [N, P, H]; the sum over pairs is left to the consumer (the decoder's
                   next fused add + RMSNorm, ``layers/norm.RMSNorm.add``)

Rounding follows the reference (``layers/moe.reference_experts``): gate/up outputs, silu, the product,
the expert output and its weighted value are each rounded to the activations' dtype; the sum over
a token's experts is the consumer's, in the reference's order and steps (pairs in ascending expert
id, each sum rounded: ``layers/norm.residual_add``).

FP8 experts (``ExpertScales``): each K step is cut into sub-blocks inside one scale column; a
sub-block's partial sum is multiplied by its scale (the e4m3 weights widened to fp32 in registers).

A shared expert of width W folds in as S = ceil(W / I) experts of width I: silu(gate)·up is per
unit and the down projection sums over units, so its slices' outputs add up to the shared
expert's (the last slice padded with zero units, which add exactly nothing).

Launch configurations (``expert_gate_up``: rows of the intermediate, columns of x per step, warps;
``expert_down``: output columns, units per step, warps) come from the device's tuned file
(``configs/fused_moe,device_name=<GPU>.json``), else ``GATE_UP_BLOCKS`` / ``DOWN_BLOCKS``; spans are
clipped to the next power of two of H and I, so a span >= that reads a whole row in one step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl, tuned
from omniwalk.kernels.grouped_fp8 import grouped_fp8_experts
from omniwalk.kernels.moe_routing import route_folded, route_topk, sort_pairs, unsort_pairs
from omniwalk.kernels.silu_mul import silu_mul_triton
from omniwalk.layers import moe as moe_layer
from omniwalk.layers.fp8 import ExpertScales

# where the device has no tuned file: (rows of the intermediate, columns of x per step, warps) of a gate_up
# program, (output columns, units per step, warps) of a down program; FP8 experts take the same
GATE_UP_BLOCKS = (2, 2048, 4)
DOWN_BLOCKS = (16, 256, 8)


def _blocks(projection: str, scales: ExpertScales | None, device) -> tuple[int, int, int]:
    """The tuned (``configs/fused_moe,...``) or default configuration of ``projection`` ("gate_up", "down")."""
    key = projection if scales is None else f"{projection},fp8"
    entry = tuned.configs("fused_moe", tuned.device_of(device)).get(key)
    if entry is None:
        return GATE_UP_BLOCKS if projection == "gate_up" else DOWN_BLOCKS
    fields = ("rows", "columns", "warps") if projection == "gate_up" else ("columns", "units", "warps")
    return tuple(entry[f] for f in fields)


class FusedMoE:
    """The fused backend of ``layers/moe.SparseMoE`` (see the module docstring)."""

    def prepare(self, moe) -> None:
        """Once the weights are loaded: fold the shared expert into the experts (``SparseMoE.fold_shared_expert``)."""
        moe.fold_shared_expert()

    def forward(self, moe, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> per-pair partials [N, P, H] (their sum is the MoE's output)."""
        experts = moe.experts
        route_args = (moe.top_k, moe.renormalize, moe.num_shared)
        draw = (moe.draw_salt, moe.draws) if moe.is_balanced else None  # (the kernel advances the counter)
        if x.shape[0] * (moe.top_k + moe.num_shared) <= moe_layer.MAX_GEMV_PAIRS:
            weights, ids = route_folded(x, moe.gate.weight, moe.route_counters, *route_args, draw=draw)
            out = expert_gemv(x, experts.gate_up_proj, experts.down_proj, weights, ids, experts.scales())
        else:
            weights, ids = route_topk(moe.gate(x), *route_args, draw=draw)
            pair = (experts.gate_up_proj, experts.down_proj)
            if experts.block is None:
                out = grouped_experts(x, *pair, weights, ids)
            else:
                out = grouped_fp8_experts(x, *pair, experts.scales(), weights, ids)
        if moe.shared_expert is not None:  # (not folded: one more partial)
            out = torch.cat([out, moe.shared_output(x)[:, None].to(out.dtype)], 1)
        return out


FUSED_MOE = FusedMoE()


def grouped_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Grouped GEMM over expert-sorted (token, expert) pairs; routing stays on the device.

    The N*k pairs are sorted by expert (``moe_routing.sort_pairs``); its per-expert ends are the
    cumulative ``offs`` of ``torch._grouped_mm`` (one launch per projection, whatever the number of
    experts hit), and the weighted rows go back to pair order: -> [N, k, H] partials, summed by the
    consumer like ``expert_gemv``'s (in the pairs' order, ascending expert id, as HF adds
    them). No host synchronisation.
    """
    num_tokens, top_k = ids.shape
    pairs = sort_pairs(ids, weights, gate_up.shape[0])
    h = torch._grouped_mm(x.index_select(0, pairs.tokens), gate_up.transpose(1, 2), offs=pairs.ends)
    y = torch._grouped_mm(silu_mul_triton(h), down.transpose(1, 2), offs=pairs.ends)
    return unsort_pairs(y, pairs).view(num_tokens, top_k, x.shape[1])


def expert_gemv(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """x [N, H], gate_up [E, 2I, H], down [E, H, I], weights/ids [N, P] -> weighted expert outputs
    [N, P, H] in x's dtype (sum over P = the MoE output). FP8 experts come with their ``scales``."""
    ids = ids.contiguous()
    act = expert_gate_up(x, gate_up, ids, scales=scales)
    return expert_down(act, down, weights, ids, scales=scales)


def expert_gate_up(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    ids: torch.Tensor,
    blocks: tuple[int, int, int] | None = None,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """x [N, H], gate_up [E, 2I, H], ids [N, P] -> act [N * P, I]: silu(gate·x) * (up·x) per (token, expert) pair."""
    assert x.dim() == 2 and gate_up.dim() == 3 and gate_up.shape[2] == x.shape[1], "x [N, H], gate_up [E, 2I, H]"
    blocks = blocks or _blocks("gate_up", scales, x.device)
    n, p = ids.shape
    hidden, inter = x.shape[1], gate_up.shape[1] // 2
    x = x.contiguous()
    act = x.new_empty(n * p, inter)
    if n:
        rows, columns, warps = blocks
        s = gate_up if scales is None else scales.gate_up
        strides = (0, 0, 0) if scales is None else (s.stride(0), s.stride(1), s.stride(2))
        step = min(columns, _pow2(hidden))
        expert_gate_up_kernel[(n * p, -(-inter // rows))](
            x,
            gate_up,
            s,
            ids,
            act,
            gate_up.stride(0),
            gate_up.stride(1),
            *strides,
            H=hidden,
            INTER=inter,
            P=p,
            BLOCK_I=rows,
            BLOCK_H=step,
            **_scaling(scales),
            SUB_H=_sub(step, scales),
            num_warps=warps,
            **pdl.launch(x.device),
        )
    return act


def expert_down(
    act: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    blocks: tuple[int, int, int] | None = None,
    scales: ExpertScales | None = None,
) -> torch.Tensor:
    """act [N * P, I], down [E, H, I] -> [N, P, H]: each pair's expert output times its routing weight."""
    assert down.dim() == 3 and act.shape == (ids.numel(), down.shape[2]), "expert_down: act [N * P, I], down [E, H, I]"
    blocks = blocks or _blocks("down", scales, act.device)
    n, p = ids.shape
    hidden, inter = down.shape[1], down.shape[2]
    out = act.new_empty(n, p, hidden)
    if n:
        columns, units, warps = blocks
        s = down if scales is None else scales.down
        strides = (0, 0) if scales is None else (s.stride(0), s.stride(1))
        step = min(units, _pow2(inter))
        expert_down_kernel[(n * p, -(-hidden // columns))](
            act,
            down,
            s,
            ids,
            weights.contiguous(),
            out,
            down.stride(0),
            down.stride(1),
            *strides,
            H=hidden,
            INTER=inter,
            BLOCK_N=columns,
            BLOCK_I=step,
            **_scaling(scales),
            SUB_I=_sub(step, scales),
            num_warps=warps,
            **pdl.launch(act.device),
        )
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


@triton.jit
def routed_expert(ids_ptr, pair, USE_PDL: tl.constexpr):
    """The pair's expert id (int64), read after the PDL wait."""
    if USE_PDL:  # (the weights to read depend on the routing ids: nothing to load before the wait)
        gdc_wait()
        gdc_launch_dependents()
    return tl.load(ids_ptr + pair).to(tl.int64)


@triton.jit
def sub_block_steps(BLOCK: tl.constexpr, SUB: tl.constexpr):
    """Offsets of a step of BLOCK columns as [1, BLOCK / SUB, SUB] sub-blocks, each inside one scale column."""
    return tl.arange(0, BLOCK // SUB)[None, :, None] * SUB + tl.arange(0, SUB)[None, None, :]


@triton.jit
def sub_block_scales(
    scales, start, row_ok, K: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr, SCALE_K: tl.constexpr
):
    """[rows, BLOCK / SUB] scale_inv of the step at column ``start``'s sub-blocks (FP8): ``scales``
    points at each row's scale row, a scale column spans SCALE_K of the K columns."""
    sub = (start + tl.arange(0, BLOCK // SUB) * SUB)[None, :]
    return tl.load(scales + sub // SCALE_K, mask=row_ok[:, None] & (sub < K), other=0.0)


@triton.jit
def expert_gate_up_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    act_ptr,
    stride_we,
    stride_wr,
    stride_se,
    stride_sh,
    stride_sr,
    H: tl.constexpr,
    INTER: tl.constexpr,
    P: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    SUB_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    expert = routed_expert(ids_ptr, pair, USE_PDL)
    token = pair // P
    rows = block * BLOCK_I + tl.arange(0, BLOCK_I)
    row_ok = rows < INTER
    gate_rows = (w_ptr + expert * stride_we + rows[:, None] * stride_wr)[:, :, None]
    up_rows = gate_rows + INTER * stride_wr
    # SCALED (FP8): gate (up) weight (r, h) has scale_inv s[expert, 0 (1), r // SCALE_N, h // SCALE_K]
    gate_scales = s_ptr + expert * stride_se + (rows // SCALE_N)[:, None] * stride_sr
    up_scales = gate_scales + stride_sh
    steps = sub_block_steps(BLOCK_H, SUB_H)
    acc_gate = tl.zeros((BLOCK_I,), tl.float32)
    acc_up = tl.zeros((BLOCK_I,), tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + steps
        col_ok = cols < H
        x = tl.load(x_ptr + token * H + cols, mask=col_ok, other=0.0).to(tl.float32)
        ok = row_ok[:, None, None] & col_ok
        gate = tl.sum(tl.load(gate_rows + cols, mask=ok, other=0.0).to(tl.float32) * x, 2)  # [BLOCK_I, sub-blocks]
        up = tl.sum(tl.load(up_rows + cols, mask=ok, other=0.0).to(tl.float32) * x, 2)
        if SCALED:
            gate *= sub_block_scales(gate_scales, start, row_ok, H, BLOCK_H, SUB_H, SCALE_K)
            up *= sub_block_scales(up_scales, start, row_ok, H, BLOCK_H, SUB_H, SCALE_K)
        acc_gate += tl.sum(gate, 1)
        acc_up += tl.sum(up, 1)
    dtype = act_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    act = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
    tl.store(act_ptr + pair * INTER + rows, act, mask=row_ok)


@triton.jit
def expert_down_kernel(
    act_ptr,
    w_ptr,
    s_ptr,
    ids_ptr,
    weights_ptr,
    out_ptr,
    stride_we,
    stride_wr,
    stride_se,
    stride_sr,
    H: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    SUB_I: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    expert = routed_expert(ids_ptr, pair, USE_PDL)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    rows = (w_ptr + expert * stride_we + cols[:, None] * stride_wr)[:, :, None]
    scales = s_ptr + expert * stride_se + (cols // SCALE_N)[:, None] * stride_sr  # (SCALED, as in gate_up)
    steps = sub_block_steps(BLOCK_I, SUB_I)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, INTER, BLOCK_I):
        units = start + steps
        unit_ok = units < INTER
        act = tl.load(act_ptr + pair * INTER + units, mask=unit_ok, other=0.0).to(tl.float32)
        w = tl.load(rows + units, mask=col_ok[:, None, None] & unit_ok, other=0.0)
        part = tl.sum(w.to(tl.float32) * act, 2)  # [BLOCK_N, sub-blocks]
        if SCALED:
            part *= sub_block_scales(scales, start, col_ok, INTER, BLOCK_I, SUB_I, SCALE_K)
        acc += tl.sum(part, 1)
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + pair * H + cols, (acc.to(dtype).to(tl.float32) * weight).to(dtype), mask=col_ok)
