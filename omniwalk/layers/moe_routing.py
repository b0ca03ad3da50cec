"""MoE routing on the device in one kernel: softmax (fp32) over the E routed experts, top-k,
optional renormalisation; with a shared expert folded in (``num_shared`` > 0) the router has one
more row, its gate, and slots top_k .. P-1 name experts E .. E+num_shared-1 with weight
sigmoid(gate). Output: weights [N, P] (activation dtype), ids [N, P] int32, P = top_k + num_shared;
the top-k set as ``torch.topk`` picks it (ties at the k-th: the lower id), its slots in ascending
expert id (then the shared slots, ids E ..): the order in which HF adds the experts' outputs
(``index_add_`` per expert, ascending), which the consumer of the per-pair outputs repeats
(``norm.residual_add``), so a token's MoE output rounds as HF's does.

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
                  the pairs routed to a lower id, then its own). It replaced a radix sort, a count
                  and a cumulative sum (H200, thinker decode at B = 32: the sort alone took 13 µs a
                  layer; with this kernel the step 9.39 -> 8.13 ms, 1555 -> 883 kernels, session 34).

Rounding follows the reference (``moe.route(F.linear(x, router))``): logits are accumulated in
fp32 and rounded to the activations' dtype (the router Linear's output), then softmax in fp32.

The top-k is a rank per expert (how many experts are ahead of it), one [E, E] comparison.
H200, micro.py kernel busy µs (k2 calls 1 and 2), rank vs k rounds of argmax: folded, thinker B=1
5.9 vs 8.4; given logits, thinker B=32 5.4 vs 4.0. NOTE: the folded kernel's difference is not the
top-k's own cost: the rank's [E, E] tile needs 168 registers, and with them ptxas issues all the
router loads of a program at once; at argmax's 40 registers it interleaves them with the FMAs, a
DRAM round trip per wave (sm_90a SASS). A barrier between loads and arithmetic does not stop it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from omniwalk.layers import pdl

# route_folded: (router rows per program, warps). H200: see benchmarks/fused_moe.py
ROUTER_BLOCKS = (4, 4)


@functools.cache
def _kernels():
    """The kernels' module (``route``, ``sort_pairs``), imported on first use (CPU installs lack Triton)."""
    from omniwalk.layers import moe_routing_triton

    return moe_routing_triton


def route_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, num_shared: int = 0, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E + (1 if num_shared else 0)] -> (weights [N, top_k + num_shared] in ``dtype``
    (default: the logits'), expert ids [N, top_k + num_shared] int32)."""
    n = logits.shape[0]
    num_experts = logits.shape[1] - (1 if num_shared else 0)
    weights, ids = _outputs(n, top_k + num_shared, dtype or logits.dtype, logits.device)
    if n:
        _kernels().route[(n, 1)](
            logits, logits, logits, ids, weights, ids, 0, 0, logits.stride(0),
            H=1, E=num_experts, E_PAD=pow2(num_experts), K=top_k, SHARED=num_shared, RENORM=renormalize,
            FOLDED=False, BLOCK_E=1, BLOCK_H=1, **pdl.launch(logits.device),
        )  # fmt: skip
    return weights, ids


def route_folded(
    x: torch.Tensor, router: torch.Tensor, counters: torch.Tensor, top_k: int, renormalize: bool,
    num_shared: int = 0, blocks: tuple[int, int] = ROUTER_BLOCKS,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x [N, H], router [E + (1 if num_shared else 0), H] -> the same as
    ``route_topk(F.linear(x, router), ...)``. counters: int32 [>= N], zero, and zero again after
    (one set per caller that may run concurrently with another, e.g. per MoE layer)."""
    n, hidden = x.shape
    if n > counters.numel():
        raise ValueError(f"route_folded: {n} tokens but {counters.numel()} counters")
    num_experts = router.shape[0] - (1 if num_shared else 0)
    weights, ids = _outputs(n, top_k + num_shared, x.dtype, x.device)
    if n:
        rows, warps = blocks
        e_pad = pow2(num_experts)
        scratch = torch.empty(n, e_pad + 1, dtype=torch.float32, device=x.device)
        x = x.contiguous()
        _kernels().route[(n, -(-router.shape[0] // rows))](
            x, router, scratch, counters, weights, ids, x.stride(0), router.stride(0), scratch.stride(0),
            H=hidden, E=num_experts, E_PAD=e_pad, K=top_k, SHARED=num_shared, RENORM=renormalize,
            FOLDED=True, BLOCK_E=rows, BLOCK_H=min(pow2(hidden), 4096), num_warps=warps, **pdl.launch(x.device),
        )  # fmt: skip
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
    p = ids.shape[1]
    flat_ids, flat_weights = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    pairs = flat_ids.numel()
    order = torch.empty(pairs, dtype=torch.long, device=ids.device)
    tokens = torch.empty_like(order)
    sorted_weights = torch.empty_like(flat_weights)
    # (every program writes its expert's end; with no pairs at all there is no launch: all zero)
    ends = (torch.empty if pairs else torch.zeros)(num_experts, dtype=torch.int32, device=ids.device)
    if pairs:
        _kernels().sort_pairs[(num_experts,)](
            flat_ids, flat_weights, order, tokens, sorted_weights, ends, pairs, P=p,
            BLOCK=min(1024, pow2(pairs)), **pdl.launch(ids.device),
        )  # fmt: skip
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
