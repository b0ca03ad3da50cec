"""Triton code of the MoE routing kernel; ``moe_routing`` launches it (and says what it computes).
Imported on first use only: it needs triton.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def router_logits(
    x_ptr, router_ptr, logits_ptr, n, stride_x, stride_r, stride_l,
    H: tl.constexpr, E: tl.constexpr, SHARED: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """This program's block of router rows times token n's x -> its logits (fp32 scratch row n); the
    shared gate is row E."""
    rows = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    row_ok = rows < E + (1 if SHARED > 0 else 0)
    acc = tl.zeros((BLOCK_E,), tl.float32)
    # each step's router tile is loaded one step ahead: the first before the PDL wait
    w = tl.load(router_ptr + rows[:, None] * stride_r + tl.arange(0, BLOCK_H)[None, :],
                mask=row_ok[:, None] & (tl.arange(0, BLOCK_H) < H)[None, :], other=0.0)  # fmt: skip
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    for start in range(0, H, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        x = tl.load(x_ptr + n * stride_x + cols, mask=cols < H, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
        ok = row_ok[:, None] & (cols + BLOCK_H < H)[None, :]
        w = tl.load(router_ptr + rows[:, None] * stride_r + BLOCK_H + cols[None, :], mask=ok, other=0.0)
    block_logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)  # the router Linear's output dtype
    tl.store(logits_ptr + n * stride_l + rows, block_logits, mask=row_ok)


@triton.jit
def store_top_k(
    logits_ptr, weights_ptr, ids_ptr, n, stride_l,
    E: tl.constexpr, E_PAD: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr, RENORM: tl.constexpr,
):  # fmt: skip
    """Token n's logits -> softmax, top-k by rank -> its weights and ids (ascending expert id), then
    the shared expert's slots (weight sigmoid(gate))."""
    e = tl.arange(0, E_PAD)
    logit = tl.load(logits_ptr + n * stride_l + e, mask=e < E, other=float("-inf"), cache_modifier=".cg")
    logit = logit.to(tl.float32)
    prob = tl.exp(logit - tl.max(logit, 0))
    prob = prob / tl.sum(prob, 0)
    # rank[i] = experts ahead of i: a larger probability, or an equal one and a lower id
    ahead = (prob[None, :] > prob[:, None]) | ((prob[None, :] == prob[:, None]) & (e[None, :] < e[:, None]))
    picked = tl.sum(ahead.to(tl.int32), 1) < K
    if RENORM:
        prob = prob / tl.sum(tl.where(picked, prob, 0.0), 0)
    dtype = weights_ptr.dtype.element_ty
    slot = tl.cumsum(picked.to(tl.int32), 0) - 1  # ascending expert id among the picked
    tl.store(weights_ptr + n * (K + SHARED) + slot, prob.to(dtype), mask=picked)
    tl.store(ids_ptr + n * (K + SHARED) + slot, e, mask=picked)
    if SHARED > 0:
        gate = tl.load(logits_ptr + n * stride_l + E, cache_modifier=".cg").to(tl.float32)
        weight = (1.0 / (1.0 + tl.exp(-gate))).to(dtype)
        for s in tl.static_range(SHARED):
            tl.store(weights_ptr + n * (K + SHARED) + K + s, weight)
            tl.store(ids_ptr + n * (K + SHARED) + K + s, E + s)


@triton.jit
def route(
    x_ptr, router_ptr, logits_ptr, counter_ptr, weights_ptr, ids_ptr, stride_x, stride_r, stride_l,
    H: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr,
    RENORM: tl.constexpr, FOLDED: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    n, last = tl.program_id(0).to(tl.int64), tl.num_programs(1) - 1
    if FOLDED:  # this program's block of router rows -> logits (fp32 scratch); the shared gate is row E
        router_logits(
            x_ptr, router_ptr, logits_ptr, n, stride_x, stride_r, stride_l, H, E, SHARED, BLOCK_E, BLOCK_H, USE_PDL
        )
        tl.debug_barrier()  # every thread's logits are written before the release below
        done = tl.atomic_add(counter_ptr + n, 1, sem="acq_rel", scope="gpu")
    else:  # one program per token, its logits given
        if USE_PDL:
            gdc_wait()
            gdc_launch_dependents()
        done = last
    if done == last:  # (folded: the token's last program to finish; its logits are all written)
        store_top_k(logits_ptr, weights_ptr, ids_ptr, n, stride_l, E, E_PAD, K, SHARED, RENORM)
        if FOLDED:
            tl.store(counter_ptr + n, 0)


@triton.jit
def sort_pairs(
    ids_ptr, weights_ptr, order_ptr, tokens_ptr, sorted_weights_ptr, ends_ptr, pairs,
    P: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Program e: the pairs routed to expert e, in pair order, at positions start(e) .. end(e) - 1 of the
    expert-sorted order, start(e) = pairs routed to a lower id (a first pass over the ids)."""
    expert = tl.program_id(0)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    start = tl.sum(tl.zeros((BLOCK,), tl.int32), 0)
    for first in range(0, pairs, BLOCK):
        pair = first + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + pair, mask=pair < pairs, other=0x7FFFFFFF)
        start += tl.sum((ids < expert).to(tl.int32), 0)
    for first in range(0, pairs, BLOCK):
        pair = first + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + pair, mask=pair < pairs, other=0x7FFFFFFF)
        hit = ids == expert
        at = start + tl.cumsum(hit.to(tl.int32), 0) - 1  # (pair order within the expert: the sort is stable)
        tl.store(order_ptr + at, pair.to(tl.int64), mask=hit)
        tl.store(tokens_ptr + at, (pair // P).to(tl.int64), mask=hit)
        tl.store(sorted_weights_ptr + at, tl.load(weights_ptr + pair, mask=hit), mask=hit)
        start += tl.sum(hit.to(tl.int32), 0)
    tl.store(ends_ptr + expert, start)
