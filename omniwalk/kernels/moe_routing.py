"""MoE routing on the device in one kernel: softmax (fp32) over the E routed experts, top-k,
optional renormalisation; with a shared expert folded in (``num_shared`` > 0) the router has one
more row, its gate, and slots top_k .. P-1 name experts E .. E+num_shared-1 with weight
sigmoid(gate). Output: weights [N, P] (activation dtype), ids [N, P] int32, P = top_k + num_shared;
the top-k set as ``torch.topk`` picks it (ties at the k-th: the lower id), its slots in ascending
expert id (then the shared slots, ids E ..): the order in which HF adds the experts' outputs
(``index_add_`` per expert, ascending), which the consumer of the per-pair outputs repeats
(``layers/norm.residual_add``), so a token's MoE output rounds as HF's does.

    route_topk    logits [N, E (+1)] -> weights, ids; one program per token (many tokens: the
                  router is a GEMM, e.g. a prompt)
    route_folded  x [N, H] and the router [E (+1), H] -> weights, ids: the router GEMV folded in.
                  Programs (token, block of router rows) each write their block of logits to a
                  scratch row; the last of a token's programs to finish (an atomic counter per
                  token, left at zero for the next call) ranks them. One kernel where the
                  GEMM + routing took two, and no cuBLAS call in the decode step.
    sort_pairs    ids [N, P] -> the pairs sorted by expert (stable: pair order within an expert), their
                  tokens and weights in that order, and where each expert's rows end: the grouped
                  GEMMs' input, in one kernel of one program per expert (each reads the ids twice:
                  the pairs routed to a lower id, then its own), in place of a radix sort, a count
                  and a cumulative sum.

Balanced routing (benchmark only, ``layers/moe.py``'s module docstring): given ``draw`` = (salt, the
layer's counters [calls, tokens done]), the top-k ranks the draw's keys instead of the probabilities
(``layers/moe.balanced_keys``, the same hash: ``kernels/sampling.mix``), the weights stay the picked
experts' probabilities; each token's ranking program counts itself done, and the last of the call's
tokens advances the call counter (every token has read it by then), so no other launch is needed.

Rounding follows the reference (``layers/moe.route(F.linear(x, router))``): logits are accumulated in
fp32 and rounded to the activations' dtype (the router Linear's output), then softmax in fp32.

The top-k is a rank per expert (how many experts are ahead of it), one [E, E] comparison, not k
rounds of argmax: in the folded kernel the rank's [E, E] tile takes enough registers that ptxas issues
all the router loads of a program at once, where at argmax's register count it interleaves them with
the FMAs (a DRAM round trip per wave, sm_90a SASS); with the logits given, k rounds would be cheaper
(docs/performance.md).

Launch configuration of ``route_folded`` (router rows per program, warps): the device's tuned file
(``configs/moe_routing,device_name=<GPU>.json``), else ``ROUTER_BLOCKS``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl, tuned
from omniwalk.kernels.sampling import mix

Draw = tuple[int, torch.Tensor]  # a balanced draw: (salt, the layer's int64 counters [calls, tokens done])
ROUTER_BLOCKS = (4, 4)  # route_folded's (router rows per program, warps) where the device has no tuned file


def router_blocks(device) -> tuple[int, int]:
    entry = tuned.configs("moe_routing", tuned.device_of(device)).get("route_folded")
    return ROUTER_BLOCKS if entry is None else (entry["rows"], entry["warps"])


def route_topk(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    num_shared: int = 0,
    dtype: torch.dtype | None = None,
    draw: Draw | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E + (1 if num_shared else 0)] -> (weights [N, top_k + num_shared] in ``dtype``
    (default: the logits'), expert ids [N, top_k + num_shared] int32); ``draw``: balanced routing."""
    assert logits.dim() == 2, "route_topk: logits [N, E (+1)]"
    n = logits.shape[0]
    num_experts = logits.shape[1] - (1 if num_shared else 0)
    weights, ids = _outputs(n, top_k + num_shared, dtype or logits.dtype, logits.device)
    if n:
        salt, draws = draw or (0, ids)
        route_kernel[(n, 1)](
            logits,
            logits,
            logits,
            ids,
            weights,
            ids,
            draws,
            salt,
            0,
            0,
            logits.stride(0),
            H=1,
            E=num_experts,
            E_PAD=pow2(num_experts),
            K=top_k,
            SHARED=num_shared,
            RENORM=renormalize,
            FOLDED=False,
            BALANCED=draw is not None,
            BLOCK_E=1,
            BLOCK_H=1,
            **pdl.launch(logits.device),
        )
    return weights, ids


def route_folded(
    x: torch.Tensor,
    router: torch.Tensor,
    counters: torch.Tensor,
    top_k: int,
    renormalize: bool,
    num_shared: int = 0,
    blocks: tuple[int, int] | None = None,
    draw: Draw | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H], router [E + (1 if num_shared else 0), H] -> the same as
    ``route_topk(F.linear(x, router), ..., draw=draw)``. counters: int32 [>= N], zero, and zero again after
    (one set per caller that may run concurrently with another, e.g. per MoE layer)."""
    n, hidden = x.shape
    assert router.dim() == 2 and router.shape[1] == hidden, "route_folded: x [N, H], router [E (+1), H]"
    if n > counters.numel():
        raise ValueError(f"route_folded: {n} tokens but {counters.numel()} counters")
    num_experts = router.shape[0] - (1 if num_shared else 0)
    weights, ids = _outputs(n, top_k + num_shared, x.dtype, x.device)
    if n:
        rows, warps = blocks or router_blocks(x.device)
        e_pad = pow2(num_experts)
        scratch = torch.empty(n, e_pad + 1, dtype=torch.float32, device=x.device)
        x = x.contiguous()
        salt, draws = draw or (0, counters)
        route_kernel[(n, -(-router.shape[0] // rows))](
            x,
            router,
            scratch,
            counters,
            weights,
            ids,
            draws,
            salt,
            x.stride(0),
            router.stride(0),
            scratch.stride(0),
            H=hidden,
            E=num_experts,
            E_PAD=e_pad,
            K=top_k,
            SHARED=num_shared,
            RENORM=renormalize,
            FOLDED=True,
            BALANCED=draw is not None,
            BLOCK_E=rows,
            BLOCK_H=min(pow2(hidden), 4096),
            num_warps=warps,
            **pdl.launch(x.device),
        )
    return weights, ids


class SortedPairs(NamedTuple):
    """The (token, expert) pairs of ``ids`` [N, P] sorted by expert id, ties in pair order (pair j of
    token n is n * P + j): ``order`` [N * P] (int64 pair indices), their ``tokens`` (order // P) and
    routing ``weights``, and ``ends`` [E] int32: expert e's pairs end at ends[e] (a cumulative count)."""

    order: torch.Tensor
    tokens: torch.Tensor
    weights: torch.Tensor
    ends: torch.Tensor


def sort_pairs(ids: torch.Tensor, weights: torch.Tensor, num_experts: int) -> SortedPairs:
    """ids [N, P] (every id < ``num_experts``), weights [N, P] -> ``SortedPairs`` (one kernel; see the
    module docstring)."""
    assert ids.shape == weights.shape and ids.dim() == 2, "sort_pairs: ids and weights [N, P]"
    p = ids.shape[1]
    flat_ids, flat_weights = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    pairs = flat_ids.numel()
    order = torch.empty(pairs, dtype=torch.long, device=ids.device)
    tokens = torch.empty_like(order)
    sorted_weights = torch.empty_like(flat_weights)
    # (every program writes its expert's end; with no pairs at all there is no launch: all zero)
    ends = (torch.empty if pairs else torch.zeros)(num_experts, dtype=torch.int32, device=ids.device)
    if pairs:
        sort_pairs_kernel[(num_experts,)](
            flat_ids,
            flat_weights,
            order,
            tokens,
            sorted_weights,
            ends,
            pairs,
            P=p,
            BLOCK=min(1024, pow2(pairs)),
            **pdl.launch(ids.device),
        )
    return SortedPairs(order, tokens, sorted_weights, ends)


def unsort_pairs(y: torch.Tensor, pairs: SortedPairs) -> torch.Tensor:
    """Expert-sorted rows y [N * P, H] -> each times its routing weight, back in pair order."""
    y = y * pairs.weights[:, None].to(y.dtype)
    return torch.empty_like(y).index_copy_(0, pairs.order, y)


def _outputs(n: int, slots: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(n, slots, dtype=dtype, device=device), torch.empty(n, slots, dtype=torch.int32, device=device)


def pow2(n: int) -> int:
    """The least power of two >= n (n >= 1): Triton's block sizes."""
    return 1 << (n - 1).bit_length()


@triton.jit
def router_logits(
    x_ptr,
    router_ptr,
    logits_ptr,
    n,
    stride_x,
    stride_r,
    stride_l,
    H: tl.constexpr,
    E: tl.constexpr,
    SHARED: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """This program's block of router rows times token n's x -> its logits (fp32 scratch row n); the
    shared gate is row E."""
    rows = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    row_ok = rows < E + (1 if SHARED > 0 else 0)
    acc = tl.zeros((BLOCK_E,), tl.float32)
    # each step's router tile is loaded one step ahead: the first before the PDL wait
    w = tl.load(
        router_ptr + rows[:, None] * stride_r + tl.arange(0, BLOCK_H)[None, :],
        mask=row_ok[:, None] & (tl.arange(0, BLOCK_H) < H)[None, :],
        other=0.0,
    )
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
    logits_ptr,
    weights_ptr,
    ids_ptr,
    n,
    stride_l,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    RENORM: tl.constexpr,
    BALANCED: tl.constexpr,
    salt,
    step,
):
    """Token n's logits -> softmax, top-k by rank -> its weights and ids (ascending expert id), then
    the shared expert's slots (weight sigmoid(gate)). BALANCED: ranked by the draw's keys instead."""
    e = tl.arange(0, E_PAD)
    logit = tl.load(logits_ptr + n * stride_l + e, mask=e < E, other=float("-inf"), cache_modifier=".cg")
    logit = logit.to(tl.float32)
    prob = tl.exp(logit - tl.max(logit, 0))
    prob = prob / tl.sum(prob, 0)
    if BALANCED:
        score = tl.where(e < E, draw_keys(salt, step, n, e, E), -1)
    else:
        score = prob
    # rank[i] = experts ahead of i: a larger score, or an equal one and a lower id
    ahead = (score[None, :] > score[:, None]) | ((score[None, :] == score[:, None]) & (e[None, :] < e[:, None]))
    picked = (tl.sum(ahead.to(tl.int32), 1) < K) & (e < E)
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
def draw_keys(salt, step, n, e, E: tl.constexpr):
    """``layers/moe.balanced_keys`` for token n's experts e: int32 keys in [0, 2^31)."""
    golden = 0x9E3779B97F4A7C15
    key = mix(salt.to(tl.int64).to(tl.uint64, bitcast=True) * golden + step.to(tl.int64).to(tl.uint64, bitcast=True))
    z = mix(key + (n * E + e + 1).to(tl.uint64) * golden)
    return (z >> 33).to(tl.int32)


@triton.jit(do_not_specialize=["salt"])  # (a salt of 1 would become a constant, which has no .to)
def route_kernel(
    x_ptr,
    router_ptr,
    logits_ptr,
    counter_ptr,
    weights_ptr,
    ids_ptr,
    draws_ptr,
    salt,
    stride_x,
    stride_r,
    stride_l,
    H: tl.constexpr,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    K: tl.constexpr,
    SHARED: tl.constexpr,
    RENORM: tl.constexpr,
    FOLDED: tl.constexpr,
    BALANCED: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
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
        step = tl.load(draws_ptr, volatile=True) if BALANCED else 0
        store_top_k(logits_ptr, weights_ptr, ids_ptr, n, stride_l, E, E_PAD, K, SHARED, RENORM, BALANCED, salt, step)
        if FOLDED:
            tl.store(counter_ptr + n, 0)
        if BALANCED:  # the call's last token advances the call counter (all have read it)
            if tl.atomic_add(draws_ptr + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
                tl.store(draws_ptr, step + 1)
                tl.store(draws_ptr + 1, 0)


@triton.jit
def sort_pairs_kernel(
    ids_ptr,
    weights_ptr,
    order_ptr,
    tokens_ptr,
    sorted_weights_ptr,
    ends_ptr,
    pairs,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
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
