"""Mixture-of-experts over fused expert weights, behind a small backend interface.

Weights (shared by every backend, the layout ``weights.py`` loads):

    gate_up_proj [E, 2I, H]   rows 0..I-1 = gate, I..2I-1 = up
    down_proj    [E, H, I]

Routing is not a backend concern: ``route`` does softmax in fp32 over all experts, keeps the
top-k and optionally renormalises them to sum 1 (HF's order of operations). A backend only
computes ``y[n] = sum_j w[n, j] * down_e(silu(gate_e(x[n])) * up_e(x[n]))`` with ``e = ids[n, j]``.
The reference backend loops over the experts that received tokens (CPU, the test oracle); a
grouped-GEMM GPU backend registers beside it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# (x [N, H], gate_up [E, 2I, H], down [E, H, I], weights [N, k], ids [N, k]) -> y [N, H]
ExpertsBackend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (weights [N, k] in the logits' dtype, expert ids [N, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def reference_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Loop over hit experts in ascending id order, accumulating like HF (index_add into zeros)."""
    out = torch.zeros_like(x)
    for expert in torch.unique(ids).tolist():
        token, slot = torch.where(ids == expert)
        gate, up = F.linear(x[token], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def grouped_experts(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Grouped GEMM over expert-sorted (token, expert) pairs; routing stays on the device.

    The N*k pairs are sorted by expert; per-expert row counts become the cumulative ``offs`` of
    ``torch._grouped_mm`` (one launch per projection, whatever the number of experts hit), and
    the weighted rows are summed back per token. No host synchronisation.
    """
    num_tokens, top_k = ids.shape
    flat = ids.flatten()
    # (16-bit keys: a small radix sort makes a pass per few key bits; -0.8 ms a thinker step at B=32, H200)
    order = flat.to(torch.int16 if gate_up.shape[0] <= 2**15 else torch.int32).argsort(stable=True)
    token = order // top_k
    counts = torch.zeros(gate_up.shape[0], dtype=torch.long, device=x.device)
    counts.scatter_add_(0, flat, flat.new_ones(1).expand_as(flat))
    offs = counts.cumsum(0, dtype=torch.int32)  # (bincount would read its input's max back to the host)
    rows = x[token]
    h = torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=offs)
    y = y * weights.flatten()[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


EXPERTS_BACKENDS: dict[str, ExpertsBackend] = {"reference": reference_experts, "grouped": grouped_experts}


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``: the dense MLP and the MoE's shared expert."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class FusedExperts(nn.Module):
    """Holds the fused expert weights; the math lives in the selected backend."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, backend: str = "reference"):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.backend = EXPERTS_BACKENDS[backend]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.backend(x, self.gate_up_proj, self.down_proj, weights, ids)


class SparseMoE(nn.Module):
    """Top-k routed experts, plus a sigmoid-gated shared expert when ``shared_intermediate_size > 0``.

    Parameter names follow the checkpoint: ``gate`` (router, [E, H]), ``experts.*``,
    ``shared_expert.*``, ``shared_expert_gate`` ([1, H]).
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
        shared_intermediate_size: int = 0,
        backend: str = "reference",
    ):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size, backend)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size) if shared_intermediate_size else None
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if shared_intermediate_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, H] -> [N, H]."""
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
