"""The fused decoder kernels in bf16 on the GPU against the PyTorch reference at full size (the
CPU twin, fp32 through Triton's interpreter, is ``test_fused_kernels.py``).

Tolerances: kernels with the reference's rounding steps (norms, rotary, silu·mul) may still differ
by one bf16 step where fp32 reductions run in another order or ``exp`` is approximated; the MoE
sums a token's experts in fp32 where the reference rounds to bf16 after every expert (up to 8
roundings), so it is held to 1% of the output's scale. Each test prints what it measured."""

import copy

import pytest
import torch

from omniwalk.kernels.embed_add import embed_add_triton
from omniwalk.kernels.moe_routing import route_folded, route_topk, sort_pairs
from omniwalk.kernels.qk_norm_rope import qk_norm_rope_triton
from omniwalk.kernels.silu_mul import silu_mul_triton
from omniwalk.layers import moe
from omniwalk.layers.decoder import qk_norm_rope_reference
from omniwalk.layers.moe import SparseMoE, route, silu_mul_reference
from omniwalk.layers.norm import RMSNorm, residual_add
from omniwalk.layers.rotary import mrope_cos_sin, rotary_tables
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen3_omni.networks.talker import embed_add_reference

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a != b).float().mean().item()


@pytest.mark.parametrize("parts", [None, 0, 8])
def test_add_rms_norm(parts):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(32, 2048, generator=g, device="cuda").to(BF16)
    delta = None if parts is None else torch.randn(32, *([parts] if parts else []), 2048, generator=g, device="cuda")
    delta = delta if delta is None else delta.to(BF16)
    norm = RMSNorm(2048).to("cuda", BF16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    ref = norm.add(h, delta)
    norm.use_fused_kernel()
    ours = norm.add(h, delta)
    differ = f"h {_differ(ours[0], ref[0]):.4%} out {_differ(ours[1], ref[1]):.4%}"
    print(f"GPU-FUSED add+norm parts={parts}: elements that differ: {differ}")
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("n", [1, 32])
def test_qk_norm_rope_into_paged_store(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    heads, kv_heads, d = 32, 4, 128
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g, device="cuda").to(BF16)
    q_w, k_w = (1 + 0.1 * torch.randn(2, d, generator=g, device="cuda")).to(BF16)
    positions = torch.randint(0, 4000, (3, n), generator=g, device="cuda")
    cos, sin = rotary_tables(*mrope_cos_sin(positions, d, 1e6, (24, 20, 20)), BF16)
    slots = torch.randperm(1000, device="cuda")[:n]
    stores = [tuple(torch.zeros(1000, kv_heads, d, device="cuda", dtype=BF16) for _ in "kv") + (slots,) for _ in "ab"]
    q_ref = qk_norm_rope_reference(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, stores[0])[0]
    q = qk_norm_rope_triton(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, stores[1])[0]
    print(
        f"GPU-FUSED q/k norm + rope + store n={n}: differ q {_differ(q, q_ref):.4%} "
        f"k {_differ(stores[1][0], stores[0][0]):.4%} v {_differ(stores[1][1], stores[0][1]):.4%}"
    )
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)  # no rotation: the norm alone
    norm_only = [
        f(qkv, q_w, k_w, 1e-6, ones, zeros, heads, kv_heads)[0] for f in (qk_norm_rope_reference, qk_norm_rope_triton)
    ]
    print(f"GPU-FUSED q/k norm alone n={n}: differ q {_differ(*norm_only):.4%}")
    # bitwise: the kernel rounds where the reference rounds and compiles without FP contraction
    # (with it, ~20% of q/k elements were a bf16 step off: the rotary product fused into the add)
    assert torch.equal(q, q_ref)
    assert torch.equal(stores[1][0], stores[0][0])
    assert torch.equal(stores[1][1], stores[0][1])  # v is copied


def test_silu_mul():
    x = torch.randn(32, 2 * 3072, device="cuda").to(BF16) * 3
    ours, ref = silu_mul_triton(x), silu_mul_reference(x)
    print(f"GPU-FUSED silu·mul: differ {_differ(ours, ref):.4%}")
    torch.testing.assert_close(ours, ref, rtol=8e-3, atol=8e-3)


def test_route_topk():
    logits = torch.randn(64, 128, device="cuda").to(BF16)
    weights, ids = route_topk(logits, 8, True)
    ref_w, ref_ids = route(logits, 8, True)
    rows = (ids.long().sort(-1).values == ref_ids.sort(-1).values).all(-1)
    print(f"GPU-FUSED routing: same expert set for {rows.float().mean():.2%} of tokens (bf16 logits may tie)")
    assert rows.float().mean() >= 0.95
    torch.testing.assert_close(weights[rows].sort(-1).values, ref_w[rows].sort(-1).values, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("tokens, slots, experts", [(32, 8, 128), (1024, 8, 130), (1024, 10, 258)])
def test_sort_pairs(tokens, slots, experts):
    """The grouped GEMMs' pair order equals a stable sort's, at decode and prefill sizes (many blocks)."""
    g = torch.Generator(device="cuda").manual_seed(tokens + slots)
    ids = torch.randint(0, experts - 2, (tokens, slots), generator=g, device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, slots, generator=g, device="cuda").to(BF16)
    pairs = sort_pairs(ids, weights, experts)
    order = ids.flatten().long().argsort(stable=True)
    assert torch.equal(pairs.order, order) and torch.equal(pairs.tokens, order // slots)
    assert torch.equal(pairs.weights, weights.flatten()[order])
    assert torch.equal(pairs.ends, torch.bincount(ids.flatten(), minlength=experts).cumsum(0).int())


@pytest.mark.parametrize("name, hidden, top_k, shared", [("thinker", 2048, 8, 0), ("talker", 1024, 6, 2)])
@pytest.mark.parametrize("tokens", [1, 16])
def test_route_folded(name, hidden, top_k, shared, tokens):
    """Against ``route`` on cuBLAS's bf16 router logits: the logits may differ by a bf16 step where
    the fp32 sums run in another order, which flips a choice only at a near-tie."""
    g = torch.Generator(device="cuda").manual_seed(5)
    tokens_x = torch.randn(64 * tokens, hidden, generator=g, device="cuda").to(BF16)
    router = (torch.randn(128 + (1 if shared else 0), hidden, generator=g, device="cuda") * hidden**-0.5).to(BF16)
    counters = torch.zeros(16, dtype=torch.int32, device="cuda")
    got = [route_folded(x, router, counters, top_k, True, shared) for x in tokens_x.split(tokens)]
    weights, ids = (torch.cat(t) for t in zip(*got, strict=True))
    logits = torch.nn.functional.linear(tokens_x, router)
    ref_w, ref_ids = route(logits[:, :128], top_k, True)
    rows = (ids[:, :top_k].long().sort(-1).values == ref_ids.sort(-1).values).all(-1)
    print(
        f"GPU-FUSED folded router {name} tokens={tokens}: same expert set for {rows.float().mean():.2%} of "
        f"{rows.numel()} tokens; counters left {counters.abs().sum().item()}"
    )
    assert rows.float().mean() >= 0.95 and counters.abs().sum().item() == 0
    torch.testing.assert_close(weights[rows, :top_k].sort(-1).values, ref_w[rows].sort(-1).values, rtol=1e-2, atol=1e-3)
    if shared:
        assert (ids[:, top_k:] == torch.arange(128, 128 + shared, device="cuda")).all()
        torch.testing.assert_close(weights[:, top_k:], torch.sigmoid(logits[:, 128:]).expand(-1, shared))


@pytest.mark.parametrize(
    "name, hidden, experts, top_k, inter, shared",
    [("thinker", 2048, 128, 8, 768, 0), ("talker", 1024, 128, 6, 384, 768)],
)
@pytest.mark.parametrize("tokens", [1, 8, 32, 1024])  # 32, 1024 (a prefill chunk): past MAX_GEMV_PAIRS, grouped
@torch.inference_mode()
def test_fused_moe_matches_reference(name, hidden, experts, top_k, inter, shared, tokens):
    torch.manual_seed(tokens)  # (the input below: the same on every run)
    with torch.device("cuda"):
        ref = SparseMoE(hidden, experts, top_k, inter, True, shared).to(BF16)
    randomize(ref, 3)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    x = torch.randn(tokens, hidden, device="cuda").to(BF16)
    out = fused(x)
    out = residual_add(torch.zeros_like(x), out)  # (the pairs summed as the decoder's next add + norm sums them)
    expected = ref(x)
    err = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    path = "GEMV" if tokens * (top_k + fused.num_shared) <= moe.MAX_GEMV_PAIRS else "grouped"
    print(
        f"GPU-FUSED MoE {name} tokens={tokens} ({path}): max error {err:.2e} of the output's max, "
        f"elements that differ {_differ(out, expected):.4%}"
    )
    # both sides round expert outputs and their weighted sums to bf16 (2^-8 relative), in different orders: a few
    # roundings at the output's largest element
    assert err < 2e-2


@pytest.mark.parametrize("rows", [1, 32])
def test_embed_add(rows):
    """The code predictor's embedding + running sum: a copy and one rounded add, bitwise the reference."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    table = torch.randn(2048, 1024, generator=g, device="cuda").to(BF16)
    total = torch.randn(rows, 1024, generator=g, device="cuda").to(BF16)
    ids = torch.randint(0, 2048, (rows,), generator=g, device="cuda")
    ours, ref = embed_add_triton(table, ids, total), embed_add_reference(table, ids, total)
    print(f"GPU-FUSED embed_add rows={rows}: differ {_differ(ours[0], ref[0]):.4%} / {_differ(ours[1], ref[1]):.4%}")
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
