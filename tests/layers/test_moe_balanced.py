"""Balanced MoE routing (benchmark only, ``layers/moe.py``): uniform, distinct, seeded draws whose gate
weights are the router's probabilities of the drawn experts; the reference layer and the routing
kernels (through Triton's CPU interpreter) draw the same experts and advance the same counter.

Balanced MoE routing on the GPU (bf16, 128 experts, top 8, a folded shared expert): the fused layer draws
the reference layer's experts on both of its paths (routing folded into the router GEMV with expert GEMVs;
routing on the router's logits with the grouped GEMM), and a CUDA graph of it draws afresh each replay.
The CPU twin (Triton's interpreter): ``test_moe_balanced.py``."""

import copy

import pytest
import torch
from helpers.triton_cpu import CPU_ONLY, TOL

from omniwalk.kernels.moe_routing import route_folded, route_topk
from omniwalk.layers import moe as moe_layer
from omniwalk.layers.moe import (
    SparseMoE,
    balanced_keys,
    draw_salt,
    reference_experts,
    route_balanced,
    use_routing,
)
from omniwalk.models.common.checkpoint.loader import randomize


def draw(num_tokens: int, num_experts: int, top_k: int, seed: int = 0, layer: int = 0, step: int = 0):
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(step))
    keys = balanced_keys(draw_salt(seed, layer), torch.tensor(step), num_tokens, num_experts)
    return logits, route_balanced(logits, top_k, True, keys)


def test_draws_are_uniform_over_experts():
    """4,096 tokens x 8 of 128 experts: each expert's count near 256 (chi-square, 127 degrees of
    freedom: mean 127, sd 16; the bound is ~4.5 sd)."""
    _, (_, ids) = draw(4096, 128, 8, seed=7)
    counts = torch.bincount(ids.flatten(), minlength=128).double()
    expected = 4096 * 8 / 128
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 200, chi2
    assert counts.min() > 0


def test_draws_are_distinct_per_token_and_sorted():
    _, (_, ids) = draw(512, 16, 8)
    assert all(len(set(row)) == 8 for row in ids.tolist())
    assert torch.equal(ids, ids.sort(dim=-1).values)


def test_draws_follow_seed_layer_and_step():
    ids = {key: draw(64, 128, 8, *key)[1][1] for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]}
    assert torch.equal(draw(64, 128, 8, 0, 0, 0)[1][1], ids[(0, 0, 0)])  # deterministic
    others = [k for k in ids if k != (0, 0, 0)]
    assert all((ids[k] != ids[(0, 0, 0)]).any(dim=-1).float().mean() > 0.9 for k in others)


def test_weights_are_the_router_probabilities_of_the_drawn_experts():
    logits, (weights, ids) = draw(32, 20, 4)
    drawn = logits.gather(1, ids)
    torch.testing.assert_close(weights, torch.softmax(drawn, dim=-1), **TOL)  # renormalised: softmax of the drawn
    keys = balanced_keys(draw_salt(0, 0), torch.tensor(0), 32, 20)
    raw_weights, raw_ids = route_balanced(logits, 4, False, keys)
    assert torch.equal(raw_ids, ids)
    torch.testing.assert_close(raw_weights, torch.softmax(logits, dim=-1).gather(1, ids), **TOL)


def tiny_moe(shared: int = 0) -> SparseMoE:
    torch.manual_seed(0)
    moe = SparseMoE(24, 12, 3, 16, True, shared_intermediate_size=shared)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return moe


def test_reference_layer_draws_and_advances_per_call():
    moe = tiny_moe()
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(1))
    use_routing(moe, "balanced", seed=3)
    outs = []
    for step in range(2):
        keys = balanced_keys(draw_salt(3, 0), torch.tensor(step), 5, 12)
        weights, ids = route_balanced(moe.gate(x), 3, True, keys)
        expected = reference_experts(x, moe.experts.gate_up_proj, moe.experts.down_proj, weights, ids)
        outs.append(moe(x))
        torch.testing.assert_close(outs[-1], expected, **TOL)
    assert moe.draws[0].item() == 2
    assert not torch.equal(outs[0], outs[1])  # a fresh draw per call
    use_routing(moe, "model")
    assert moe.draws[0].item() == 0 and not moe.is_balanced


def test_use_routing_salts_each_layer_and_rejects_unknown_modes():
    layers = torch.nn.Sequential(tiny_moe(), tiny_moe())
    use_routing(layers, "balanced", seed=5)
    assert [m.draw_salt for m in layers] == [draw_salt(5, 0), draw_salt(5, 1)]
    with pytest.raises(ValueError, match="moe routing"):
        use_routing(layers, "uniform")


@CPU_ONLY
@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("shared", [0, 2])
def test_routing_kernels_draw_the_reference_experts(interpreter, folded, shared):
    """Two calls of 6 tokens: the kernel's ids and weights equal ``route_balanced``'s, its call counter
    advances once per call and its token count is back to zero."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 40, generator=g)
    router = torch.randn(20 + (1 if shared else 0), 40, generator=g) / 40**0.5
    draws = torch.zeros(2, dtype=torch.int64)
    salt = draw_salt(9, 4)
    for step in range(2):
        if folded:
            counters = torch.zeros(8, dtype=torch.int32)
            weights, ids = route_folded(x, router, counters, 4, True, shared, blocks=(4, 1), draw=(salt, draws))
        else:
            weights, ids = route_topk(x @ router.T, 4, True, shared, draw=(salt, draws))
        assert draws.tolist() == [step + 1, 0]
        logits = x @ router.T
        keys = balanced_keys(salt, torch.tensor(step), 6, 20)
        ref_w, ref_ids = route_balanced(logits[:, :20], 4, True, keys)
        assert torch.equal(ids[:, :4].long(), ref_ids)
        torch.testing.assert_close(weights[:, :4], ref_w, **TOL)
        if shared:
            assert ids[:, 4:].tolist() == [[20, 21]] * 6


@CPU_ONLY
@pytest.mark.parametrize("max_gemv_pairs", [128, 0])  # expert GEMVs, grouped GEMM
def test_fused_layer_equals_the_reference_layer_when_balanced(interpreter, monkeypatch, max_gemv_pairs):
    """Three calls through each layer (shared expert folded into the fused one): the same draws."""
    monkeypatch.setattr(moe_layer, "MAX_GEMV_PAIRS", max_gemv_pairs)
    ref = SparseMoE(32, 8, 2, 16, True, shared_intermediate_size=48)
    randomize(ref, 5)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    for layer in (ref, fused):
        use_routing(layer, "balanced", seed=1)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(6))
    for _ in range(3):
        out = fused(x)
        torch.testing.assert_close(out.sum(1) if out.dim() == 3 else out, ref(x), **TOL)
    assert fused.draws.tolist() == ref.draws.tolist() == [3, 0]


GPU_TOL = dict(rtol=2e-2, atol=2e-2)


def layers(salt: int | None = None) -> tuple[SparseMoE, SparseMoE]:
    """(reference, fused) bf16 layers with the same weights, both balanced (seed 3, or the draw's ``salt``)."""
    ref = SparseMoE(256, 128, 8, 128, True, shared_intermediate_size=256)
    randomize(ref, 5)
    ref = ref.to("cuda", torch.bfloat16)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    for layer in (ref, fused):
        use_routing(layer, "balanced", seed=3)
        layer.draw_salt = layer.draw_salt if salt is None else salt
    return ref, fused


@pytest.mark.gpu
@pytest.mark.parametrize("salt", [None, 0, 1])  # (seed 0's layers 0 and 1: Triton specialises ints 1 and 16k)
@pytest.mark.parametrize("tokens", [1, 16, 64])  # expert GEMVs up to 16 tokens (128 pairs), grouped GEMM at 64
def test_fused_draws_the_reference_experts(tokens, salt):
    ref, fused = layers(salt)
    x = torch.randn(tokens, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens))
    x = x.to(torch.bfloat16)
    for _ in range(3):
        _, ids = ref.select(x)
        out = fused(x)
        torch.testing.assert_close(out.float().sum(1), ref(x).float(), **GPU_TOL)
        assert all(len(set(row)) == 8 for row in ids.tolist())
    assert fused.draws.tolist() == ref.draws.tolist() == [3, 0]


@pytest.mark.gpu
def test_graph_replays_draw_afresh_and_advance_the_counter():
    """A graph captured at call 1 replays calls 1, 2, 3: each output equals the reference layer's call."""
    ref, fused = layers()
    x = torch.randn(4, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(0)).to(torch.bfloat16)
    fused(x)  # (compiles the kernels; call 0)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = fused(x)
    assert fused.draws.tolist() == [1, 0]  # (capture runs nothing)
    ref(x)
    outs = []
    for call in range(1, 4):
        graph.replay()
        torch.testing.assert_close(out.float().sum(1), ref(x).float(), **GPU_TOL)
        outs.append(out.clone())
        assert fused.draws.tolist() == [call + 1, 0]
    assert not torch.equal(outs[0], outs[1])
