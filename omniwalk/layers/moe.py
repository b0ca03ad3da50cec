"""Mixture-of-experts over fused expert weights; its implementations: the registry ``MOE`` (``moe_backend``).

Weights (shared by every implementation, the layout ``weights.py`` loads):

    gate_up_proj [E, 2I, H]   rows 0..I-1 = gate, I..2I-1 = up
    down_proj    [E, H, I]

Routing is not an implementation's concern: ``route`` does softmax in fp32 over all experts, keeps the
top-k and optionally renormalises them to sum 1 (HF's order of operations). An implementation only
computes ``y[n] = sum_j w[n, j] * down_e(silu(gate_e(x[n])) * up_e(x[n]))`` with ``e = ids[n, j]``.
Implementations (``SparseMoE(..., backend)`` loads one from the registry; each has ``prepare(moe)``,
called once the weights are loaded, and ``forward(moe, x)``):

    reference  ``REFERENCE_MOE``: loop over the experts that received tokens (CPU, the test oracle)
    fused      ``kernels/fused_moe.FUSED_MOE`` (CUDA): routing in one kernel, expert GEMVs while the
               (token, expert) pairs are few (at most ``MAX_GEMV_PAIRS``), a grouped GEMM beyond;
               per-pair partials summed by the decoder's next add + RMSNorm; the shared expert
               folded in as extra experts (``SparseMoE.fold_shared_expert``)

Routing modes (``SparseMoE.routing``, set on a built model by ``use_routing``; ``ModelConfig.moe_routing``):

    model     the router's top-k (``route``): the model as trained
    balanced  benchmark only: each token's k experts drawn uniformly without replacement, so expert
              traffic at B > 1 matches a trained, load-balanced router's, where random weights
              concentrate on a few experts and flatter every batched figure (docs/performance.md).
              The draw is a pure function of (seed, layer, the layer's call counter, row, expert):
              a splitmix64 key per expert, the k largest keys win (ties: the lower id); the
              counter (``SparseMoE.draws``) advances on the device once per call, so graph replays
              draw afresh with no host sync. Gate weights are the router's softmax probabilities of
              the drawn experts, renormalised as the model's own top-k is (``route_balanced``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.kernels.registry import MOE
from omniwalk.layers import fp8
from omniwalk.layers.fp8 import Block, ExpertScales, Fp8Linear
from omniwalk.layers.linear import LoraRows, MergesProjections, SkinnyLinear
from omniwalk.layers.norm import RMSNorm
from omniwalk.sampling import _GOLDEN, _mix, _shr

ROUTINGS = ("model", "balanced")

# fused backend: expert GEMVs up to this many (token, expert) pairs per call, a grouped GEMM beyond. The
# GEMVs are faster per pair, but read an expert once per pair where the grouped GEMM reads it once per
# expert: with routes concentrated on few experts, 256 pairs are faster grouped (docs/performance.md).
MAX_GEMV_PAIRS = 128


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a merged gate/up output [..., 2I] (the oracle of ``kernels/silu_mul.py``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (weights [N, k] in the logits' dtype, expert ids [N, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def balanced_keys(salt: int, step: torch.Tensor, num_tokens: int, num_experts: int) -> torch.Tensor:
    """The balanced draw's keys [N, E] (int64 in [0, 2^31)): splitmix64 of (salt, step, row, expert);
    ``salt`` = ``draw_salt(seed, layer)``, ``step`` the layer's call counter (a device scalar)."""
    key = _mix(torch.full_like(step, salt) * _GOLDEN + step)
    rows = torch.arange(num_tokens, device=step.device)[:, None] * num_experts
    z = _mix(key + (rows + torch.arange(num_experts, device=step.device)[None, :] + 1) * _GOLDEN)
    return _shr(z, 33)


def draw_salt(seed: int, layer: int) -> int:
    """The per-layer constant of the balanced draw (layers < 2^16)."""
    return seed * 2**16 + layer


def route_balanced(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` with the experts chosen by ``keys`` [N, E] (the k largest, ties: the lower id) instead of
    by probability -> (weights [N, k], ids [N, k] in ascending expert id); weights are the softmax (fp32,
    over all experts) of the drawn ones, renormalised to sum 1 where the model renormalises."""
    num_experts = keys.shape[1]
    order = keys * 2**16 + (2**16 - 1 - torch.arange(num_experts, device=keys.device))  # distinct
    ids = order.topk(top_k, dim=-1).indices.sort(dim=-1).values
    probs = torch.softmax(router_logits[:, :num_experts], dim=-1, dtype=torch.float32)
    weights = probs.gather(1, ids)
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


class GatedMLP(MergesProjections):
    """``down(silu(gate(x)) * up(x))``: the dense MLP and the MoE's shared expert.

    ``merge_projections`` (the fused decoder kernels, after loading) replaces gate and up by one gated
    ``gate_up_proj`` (rows: gate then up; silu·mul in the GEMM's epilogue) and the projections by
    ``SkinnyLinear``s (decode-sized inputs through the skinny GEMM). With ``partial_output`` (a
    decoder layer's MLP, whose output the next ``RMSNorm.add`` takes) the output may then be fp32
    partial sums [N, S, H] (``skinny_gemm``). With LoRA adapters (``lora``: a dense thinker MLP's) each
    projection's adapters add to its own product, so the merged gate/up runs as a plain product, then
    silu·mul.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, partial_output: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_proj: SkinnyLinear | None = None
        self.partial_output = partial_output

    def merge_projections(self) -> None:
        self.gate_up_proj = SkinnyLinear.merge(self.gate_proj, self.up_proj, gated=True)
        self.down_proj = SkinnyLinear.merge(self.down_proj, partials=self.partial_output)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor, lora: LoraRows | None = None, layer: int = 0) -> torch.Tensor:
        """x [n, hidden] -> [n, hidden]; ``lora``: the rows' adapters of decoder layer ``layer``."""
        if lora is not None:
            return self._adapted(x, lora, layer)
        if self.gate_up_proj is not None:
            return self.down_proj(self.gate_up_proj(x))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def after_norm(
        self, norm: RMSNorm, h: torch.Tensor, delta: torch.Tensor | None, lora: LoraRows | None = None, layer: int = 0
    ):
        """``norm.add(h, delta)`` into this MLP -> (h + delta, the MLP's output); merged, the norm runs
        inside the gate/up GEMV where it can (``SkinnyLinear.normed``), unless adapters need its input."""
        if self.gate_up_proj is None or lora is not None:
            h, x = norm.add(h, delta)
            return h, self(x, lora, layer)
        h, act = self.gate_up_proj.normed(norm, h, delta)
        return h, self.down_proj(act)

    def _adapted(self, x: torch.Tensor, lora: LoraRows, layer: int) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate = lora.add(self.gate_proj(x), x, layer, "gate_proj")
            act = F.silu(gate) * lora.add(self.up_proj(x), x, layer, "up_proj")
        else:
            from omniwalk.kernels.silu_mul import silu_mul_triton

            gate_up, inter = self.gate_up_proj.product(x), self.gate_up_proj.weight.shape[0] // 2
            if lora.holds(layer, "gate_up_proj"):  # (the pool holds them merged too: one add)
                lora.add(gate_up, x, layer, "gate_up_proj")
            else:
                lora.add(gate_up[:, :inter], x, layer, "gate_proj")
                lora.add(gate_up[:, inter:], x, layer, "up_proj")
            act = silu_mul_triton(gate_up)
        return lora.project(self.down_proj, act, layer, "down_proj")


def merged_linear(*parts: nn.Linear) -> nn.Linear:
    """One bias-free Linear whose output rows are ``parts``' outputs, in order."""
    weight = torch.cat([p.weight.data for p in parts])
    merged = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    merged.weight = nn.Parameter(weight, requires_grad=False)
    return merged


class FusedExperts(nn.Module):
    """Holds the fused expert weights ([E, 2I, H] and [E, H, I]); after ``quantize`` FP8 ones with
    their scale_inv grids (``fp8.py``; gate and up each their own: [E, 2, ceil(I / bn), ceil(H / bk)])."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.gate_up_proj_scale_inv: nn.Parameter | None = None
        self.down_proj_scale_inv: nn.Parameter | None = None
        self.block: Block | None = None  # FP8: the scale grids' block

    @torch.no_grad()
    def quantize(self, block: Block, empty: bool = False) -> None:
        """Weights -> FP8 (``empty``: uninitialised FP8 storage, for an FP8 checkpoint to fill)."""
        gate_up, down = self.gate_up_proj.data, self.down_proj.data
        inter = down.shape[2]
        if empty:
            gate_up_scales = fp8.grid((gate_up.shape[0], 2, inter, gate_up.shape[2]), block)
            parts = [
                (torch.empty_like(gate_up, dtype=fp8.FP8), gate_up.new_empty(gate_up_scales, dtype=torch.float32)),
                (
                    torch.empty_like(down, dtype=fp8.FP8),
                    down.new_empty(fp8.grid(down.shape, block), dtype=torch.float32),
                ),
            ]
        else:
            gate, up = (fp8.quantize(half, block) for half in gate_up.split(inter, 1))
            parts = [(torch.cat([gate[0], up[0]], 1), torch.stack([gate[1], up[1]], 1)), fp8.quantize(down, block)]
        self._set(parts, block)

    def _set(self, parts: list[tuple[torch.Tensor, torch.Tensor]], block: Block) -> None:
        (self.gate_up_proj, self.gate_up_proj_scale_inv), (self.down_proj, self.down_proj_scale_inv) = (
            (nn.Parameter(t, requires_grad=False) for t in part) for part in parts
        )
        self.block = block

    def scales(self) -> ExpertScales | None:
        if self.block is None:
            return None
        return ExpertScales(self.gate_up_proj_scale_inv, self.down_proj_scale_inv, self.block)

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up, down) in ``dtype``: the weights themselves, or FP8 ones dequantised (a copy)."""
        if self.block is None:
            return self.gate_up_proj, self.down_proj
        inter = self.down_proj.shape[2]
        halves = self.gate_up_proj.split(inter, 1)
        gate_up = torch.cat(
            [fp8.dequantize(h, self.gate_up_proj_scale_inv[:, i], self.block, dtype) for i, h in enumerate(halves)], 1
        )
        return gate_up, fp8.dequantize(self.down_proj, self.down_proj_scale_inv, self.block, dtype)


class SparseMoE(nn.Module):
    """Top-k routed experts, plus a sigmoid-gated shared expert when ``shared_intermediate_size > 0``.

    Parameter names follow the checkpoint: ``gate`` (router, [E, H]), ``experts.*``,
    ``shared_expert.*``, ``shared_expert_gate`` ([1, H]). ``forward`` returns [N, H], or with the
    fused implementation the per-pair partials [N, P, H] whose sum is the output (``RMSNorm.add`` sums them).
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
        self.backend = backend  # (the registry entry; its implementation: ``impl``)
        self.num_experts, self.num_shared = num_experts, 0  # num_shared: shared-expert slices folded in
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size) if shared_intermediate_size else None
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if shared_intermediate_size else None
        # route_folded's per-token counters (this layer's own: layers never run concurrently with themselves)
        self.register_buffer("route_counters", torch.zeros(MAX_GEMV_PAIRS, dtype=torch.int32), persistent=False)
        # the balanced draw (module docstring): routing mode, its salt, and the device counters
        # [calls so far, tokens routed in the current call] (the second is the fused kernel's)
        self.routing, self.draw_salt = "model", 0
        self.register_buffer("draws", torch.zeros(2, dtype=torch.int64), persistent=False)

    @property
    def backend(self) -> str:
        """The ``moe_backend`` entry this layer runs; setting it loads that implementation (``impl``:
        ``prepare`` once the weights are loaded, then ``forward``)."""
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        self.impl = MOE.load(name)
        self._backend = name

    @torch.no_grad()
    def fold_shared_expert(self) -> None:
        """The fused implementation's ``prepare``: the shared expert becomes S = ceil(width / I) extra experts
        (ids E .. E+S-1) and its gate an extra router row (logit column E); see ``kernels/fused_moe.py``."""
        if self.shared_expert is None or not self._can_fold():
            return
        e, inter = self.experts, self.experts.down_proj.shape[2]
        if e.block is None:
            gate_up, down = (
                torch.cat([w, extra])
                for w, extra in zip((e.gate_up_proj.data, e.down_proj.data), self._shared_units(), strict=True)
            )
            e.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
            e.down_proj = nn.Parameter(down, requires_grad=False)
        else:
            (gate_up, gate_up_s), (down, down_s) = self._shared_units_fp8(e.block)
            e._set(
                [
                    (torch.cat([e.gate_up_proj.data, gate_up]), torch.cat([e.gate_up_proj_scale_inv.data, gate_up_s])),
                    (torch.cat([e.down_proj.data, down]), torch.cat([e.down_proj_scale_inv.data, down_s])),
                ],
                e.block,
            )
        self.num_shared = -(-self.shared_expert.down_proj.weight.shape[1] // inter)
        self.gate = merged_linear(self.gate, self.shared_expert_gate)
        self.shared_expert = self.shared_expert_gate = None

    def _shared_units(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared expert as S experts of width I: gate_up [S, 2I, H], down [S, H, I]."""
        shared, inter = self.shared_expert, self.experts.down_proj.shape[2]
        pad = (
            -shared.down_proj.weight.shape[1] % inter
        )  # zero units (zero gate, up and down weights) add exactly nothing
        gate, up = (F.pad(p.weight, (0, 0, 0, pad)).split(inter) for p in (shared.gate_proj, shared.up_proj))
        gate_up = torch.stack([torch.cat(pair) for pair in zip(gate, up, strict=True)])
        return gate_up, torch.stack(F.pad(shared.down_proj.weight, (0, pad)).split(inter, dim=1))

    def _can_fold(self) -> bool:
        """FP8 experts take the shared expert's units with their scales only where the expert width I
        and the shared width are whole scale blocks (the published models': 384 and 768 in 128s);
        otherwise the shared expert runs beside the experts (``forward``)."""
        block = self.experts.block
        if block is None:
            return True
        widths = (self.experts.down_proj.shape[2], self.shared_expert.down_proj.weight.shape[1])
        return all(w % b == 0 for w in widths for b in block)

    def _shared_units_fp8(self, block: Block):
        """``_shared_units`` of an FP8 shared expert, each with its scales (``_can_fold``)."""
        shared, inter = self.shared_expert, self.experts.down_proj.shape[2]
        width, (bn, bk) = shared.down_proj.weight.shape[1], block
        pad = -width % inter

        def units(linear: Fp8Linear, dim: int, b: int):  # (FP8 has no pad kernel: pad its bytes; 0 = +0.0)
            q = F.pad(linear.weight.view(torch.uint8), (0, pad) if dim else (0, 0, 0, pad)).view(fp8.FP8)
            s = F.pad(linear.weight_scale_inv, (0, pad // b) if dim else (0, 0, 0, pad // b), value=1.0)
            return q.split(inter, dim), s.split(inter // b, dim)

        (gate, gate_s), (up, up_s) = units(shared.gate_proj, 0, bn), units(shared.up_proj, 0, bn)
        gate_up = torch.stack([torch.cat(pair) for pair in zip(gate, up, strict=True)])
        gate_up_s = torch.stack([torch.stack(pair) for pair in zip(gate_s, up_s, strict=True)])
        down, down_s = units(shared.down_proj, 1, bk)
        return (gate_up, gate_up_s), (torch.stack(down), torch.stack(down_s))

    @property
    def is_balanced(self) -> bool:
        return self.routing == "balanced"

    def select(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The routed experts of x [N, H] in this call -> (weights [N, k], ids [N, k]); reads the draw
        counter, does not advance it (``forward`` does)."""
        logits = moe_logits = self.gate(x) if logits is None else logits
        if self.num_shared:  # (a folded shared expert's gate is the last logit column)
            moe_logits = logits[:, : self.num_experts]
        if not self.is_balanced:
            return route(moe_logits, self.top_k, self.renormalize)
        keys = balanced_keys(self.draw_salt, self.draws[0], x.shape[0], self.num_experts)
        return route_balanced(moe_logits, self.top_k, self.renormalize, keys)

    def advance_draws(self) -> None:
        """The balanced draw's next call (an in-place device add: graph replays advance it too)."""
        if self.is_balanced:
            self.draws[0] += 1

    def after_norm(self, norm: RMSNorm, h: torch.Tensor, delta: torch.Tensor | None):
        """``norm.add(h, delta)`` into this MoE -> (h + delta, the MoE's output); the norm stays a kernel
        of its own (``GatedMLP.after_norm``'s fold is a GEMV's)."""
        h, x = norm.add(h, delta)
        return h, self(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, H] -> [N, H] (or [N, P, H] partials, see the class docstring)."""
        return self.impl.forward(self, x)

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's gated output [N, H] (where it is not folded into the experts)."""
        return torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class ReferenceMoE:
    """The reference implementation (``moe_backend="reference"``): a loop over the experts hit."""

    def prepare(self, moe: SparseMoE) -> None:
        pass

    def forward(self, moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe.select(x)
        if x.shape[0]:  # (as the routing kernel: no launch, no call)
            moe.advance_draws()
        out = reference_experts(x, *moe.experts.dequantized(x.dtype), weights, ids)
        return out if moe.shared_expert is None else out + moe.shared_output(x)


REFERENCE_MOE = ReferenceMoE()


def use_routing(module: nn.Module, routing: str, seed: int = 0) -> None:
    """Every MoE layer under ``module`` routes by ``routing`` (``ROUTINGS``); balanced draws are salted
    by ``seed`` and the layer's place in ``module.modules()`` order, and start from the first call."""
    if routing not in ROUTINGS:
        raise ValueError(f"moe routing must be one of {list(ROUTINGS)}, got {routing!r}")
    layers = [m for m in module.modules() if isinstance(m, SparseMoE)]
    for layer, moe in enumerate(layers):
        moe.routing, moe.draw_salt = routing, draw_salt(seed, layer)
        moe.draws.zero_()
