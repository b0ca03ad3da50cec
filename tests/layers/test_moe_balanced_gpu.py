"""Balanced MoE routing on the GPU (bf16, 128 experts, top 8, a folded shared expert): the fused layer draws
the reference layer's experts on both of its paths (routing folded into the router GEMV with expert GEMVs;
routing on the router's logits with the grouped GEMM), and a CUDA graph of it draws afresh each replay.
The CPU twin (Triton's interpreter): ``test_moe_balanced.py``."""

import copy

import pytest
import torch

from omniwalk.layers.moe import SparseMoE, use_routing
from omniwalk.models.common.checkpoint.loader import randomize

pytestmark = pytest.mark.gpu
TOL = dict(rtol=2e-2, atol=2e-2)


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


@pytest.mark.parametrize("salt", [None, 0, 1])  # (seed 0's layers 0 and 1: Triton specialises ints 1 and 16k)
@pytest.mark.parametrize("tokens", [1, 16, 64])  # expert GEMVs up to 16 tokens (128 pairs), grouped GEMM at 64
def test_fused_draws_the_reference_experts(tokens, salt):
    ref, fused = layers(salt)
    x = torch.randn(tokens, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens))
    x = x.to(torch.bfloat16)
    for _ in range(3):
        _, ids = ref.select(x)
        out = fused(x)
        torch.testing.assert_close(out.float().sum(1), ref(x).float(), **TOL)
        assert all(len(set(row)) == 8 for row in ids.tolist())
    assert fused.draws.tolist() == ref.draws.tolist() == [3, 0]


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
        torch.testing.assert_close(out.float().sum(1), ref(x).float(), **TOL)
        outs.append(out.clone())
        assert fused.draws.tolist() == [call + 1, 0]
    assert not torch.equal(outs[0], outs[1])
