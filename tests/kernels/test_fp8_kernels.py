"""The FP8-weight variants of the skinny GEMM and the expert GEMVs against their dequantised
reference, on the CPU through Triton's interpreter (the GPU twin: ``test_fp8_gpu.py``).

The kernels read e4m3 weights and apply each block's scale inside the sum: to a sub-block's partial sum
(the GEMV and the expert GEMVs) or to the weight tile before ``tl.dot`` (``fp8.dequantize``'s values). In fp32
that differs from ``F.linear`` of the dequantised weight only in rounding order: each output is within
``3 * K * 2**-24 * sum_k |x_k * w_k|`` of it (the order bound of the skinny GEMM tests, plus one
rounding of each scaled term).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import triton_cpu
from helpers.single_request import ContiguousKVCache
from helpers.triton_cpu import assert_activation_rounding, w8a8_experts

from omniwalk.kernels import grouped_fp8
from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels.fp8 import dequantize_triton
from omniwalk.kernels.fused_moe import ExpertScales, expert_down, expert_gate_up, expert_gemv
from omniwalk.kernels.grouped_fp8 import grouped_fp8_experts, quantize_rows
from omniwalk.kernels.skinny_gemm import Blocks, skinny_gemm
from omniwalk.layers import moe
from omniwalk.layers.decoder import use_kernels
from omniwalk.layers.fp8 import FP8, Fp8Linear, dequantize, quantize
from omniwalk.layers.linear import SkinnyLinear
from omniwalk.layers.moe import GatedMLP, SparseMoE, reference_experts, route, silu_mul_reference
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.common.networks.thinker import Thinker
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.quantization import quantize_fp8
from omniwalk.models.qwen3_omni.checkpoint.tiny import TINY_CONFIG, load_config_dict
from omniwalk.models.qwen3_omni.networks.talker import Talker

pytestmark = pytest.mark.skipif(not triton_cpu.ON_CPU, reason="interpreter tests run on the CPU machine")
K, N = 200, 72  # (off every block size: masks, partial scale blocks)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    yield from triton_cpu.interpreted(monkeypatch)


def _weight(n: int, k: int, block, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5 * (1 + 3 * torch.rand(n, 1, generator=g))  # (rows of unlike scales)
    q, scale = quantize(w, block)
    return q, scale, dequantize(q, scale, block, torch.float32)


def _assert_within_bound(ours: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(x, w)
    bound = 3 * x.shape[-1] * 2**-24 * F.linear(x.abs(), w.abs())
    assert ((ours - ref).abs() <= bound + 1e-30).all(), (ours - ref).abs().max()


@pytest.mark.parametrize("block", [(16, 32), (32, 64), (128, 128)])
@pytest.mark.parametrize("m", [1, 3, 17])  # the GEMV lanes; tl.dot with rows padded to 16, 32
@pytest.mark.parametrize("blocks", [Blocks(16, 64, 1, 4, 2), Blocks(32, 128, 1, 4, 2), Blocks(8, 256, 1, 4, 1)])
def test_fp8_product(block, m, blocks):
    """Row blocks inside one scale row (scales broadcast) and across scale rows (per-row scales);
    K steps shorter and longer than a scale block."""
    q, scale, w = _weight(N, K, block)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    y = skinny_gemm(x, q, blocks=blocks, scale=scale, scale_block=block)
    assert y.shape == (m, N) and y.dtype == torch.float32
    _assert_within_bound(y, x, w)


@pytest.mark.parametrize("block", [(16, 32), (128, 128)])
@pytest.mark.parametrize("m", [3, 17])
def test_fp8_dot_path_multiplies_the_weight_dequantised_to_bf16(block, m):
    """Several rows (``tl.dot``): the tile is dequantised as ``fp8.dequantize`` does (each weight times its
    scale in fp32, rounded once to x's dtype), so the product is the bf16 model of the dequantised weights'
    (the reference ``Fp8Linear.forward``, cuBLAS on prefill sizes) up to summation order: one rounding of
    the same fp32 sum, equal but for rare ties (none on these inputs). Scaling each K step's product after
    the dot instead (with the weight unrounded) left 34-41% of these outputs different, some
    by many bf16 steps."""
    q, scale, _ = _weight(N, K, block, seed=m)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    y = skinny_gemm(x, q, blocks=Blocks(32, 128, 1, 4, 2), scale=scale, scale_block=block)
    w_bf16 = dequantize(q, scale, block, torch.bfloat16)
    ref = F.linear(x.float(), w_bf16.float()).to(torch.bfloat16)
    ulp = 2.0 ** (torch.floor(torch.log2(ref.float().abs().clamp_min(2**-30))) - 7)
    assert ((y.float() - ref.float()).abs() <= ulp).all()
    assert (y != ref).float().mean().item() <= 0.02


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [2, 3])
def test_fp8_split_partials_and_gated(m, split):
    q, scale, w = _weight(N, K, (16, 32), seed=1)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(2))
    parts = skinny_gemm(x, q, partials=True, blocks=Blocks(16, 32, split, 4, 2), scale=scale, scale_block=(16, 32))
    assert parts.shape == (m, split, N)
    _assert_within_bound(parts.sum(1), x, w)
    gate_up = [Fp8Linear(*_weight(40, K, (8, 32), seed=s)[:2], (8, 32)) for s in (3, 4)]
    merged = SkinnyLinear.merge(*gate_up, gated=True)
    act = skinny_gemm(
        x,
        merged.weight,
        gated=True,
        blocks=Blocks(16, 32, 1, 4, 2),
        scale=merged.weight_scale_inv,
        scale_block=merged.block,
    )
    ref = silu_mul_reference(F.linear(x, torch.cat([g.dequantized(torch.float32) for g in gate_up])))
    torch.testing.assert_close(act, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [(16, 32), (128, 128), (48, 80)])  # (48, 80): partial edge blocks both ways
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_kernel_equals_the_reference(block, dtype):
    """The prefill products' dequantised copy: the reference's values exactly (fp32 product, one rounding)."""
    q, scale, _ = _weight(N + 9, K, block)
    assert torch.equal(dequantize_triton(q, scale, block, dtype), dequantize(q, scale, block, dtype))


@torch.no_grad()
@pytest.mark.parametrize("rows", [3, sg.MAX_ROWS + 2])
def test_merged_fp8_projections_equal_the_reference_modules(monkeypatch, rows):
    """GatedMLP with Fp8Linear projections: merged (gate/up gated in the kernel, down as partials;
    F.linear of the dequantised weight above MAX_ROWS) against the unmerged reference forward."""
    monkeypatch.setattr(sg, "pick_blocks", lambda m, n, k, gated, split, *_: Blocks(16, 32, 2 if split else 1, 4, 2))
    ref = GatedMLP(48, 40)
    randomize(ref, 3)
    for name in ("gate_proj", "up_proj", "down_proj"):
        setattr(ref, name, Fp8Linear.from_linear(getattr(ref, name), (16, 16)))
    fused = copy.deepcopy(ref)
    fused.merge_projections()
    assert fused.gate_up_proj.weight.dtype == FP8
    x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(7))
    out = fused(x)
    torch.testing.assert_close(out.sum(1) if out.dim() == 3 else out, ref(x), rtol=1e-5, atol=1e-5)


def _fp8_experts(num_experts: int, h: int, inter: int, block, seed: int):
    g = torch.Generator().manual_seed(seed)
    experts = moe.FusedExperts(num_experts, h, inter)
    experts.gate_up_proj.data = torch.randn(num_experts, 2 * inter, h, generator=g) / h**0.5
    experts.down_proj.data = torch.randn(num_experts, h, inter, generator=g) / inter**0.5
    experts.quantize(block)
    return experts


@pytest.mark.parametrize("block", [(16, 32), (8, 16), (128, 128)])
def test_fp8_expert_gemv(block):
    n, h, inter, num_experts = 3, 72, 40, 6
    experts = _fp8_experts(num_experts, h, inter, block, 4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, h, generator=g)
    weights, ids = route(torch.randn(n, num_experts, generator=g), 2, True)
    ref = reference_experts(x, *experts.dequantized(torch.float32), weights, ids)
    scales = experts.scales()
    assert isinstance(scales, ExpertScales) and scales.gate_up.shape == (
        num_experts,
        2,
        -(-inter // block[0]),
        -(-h // block[1]),
    )
    parts = expert_gemv(x, experts.gate_up_proj, experts.down_proj, weights, ids.int(), scales)
    torch.testing.assert_close(parts.sum(1), ref, rtol=1e-5, atol=1e-5)
    ids = ids.int()
    act = expert_gate_up(x, experts.gate_up_proj, ids, (16, 32, 1), scales=scales)  # K steps of 32: loops
    parts = expert_down(act, experts.down_proj, weights, ids, (16, 16, 1), scales=scales)
    torch.testing.assert_close(parts.sum(1), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantiser_is_fp8_quantize(group, dtype):
    """The grouped GEMM's activations, e4m3 per row and group of columns: ``quantize(x, (1, group))``'s bytes
    and scales exactly (K = 200: a partial last group; an all-zero group keeps scale 1)."""
    g = torch.Generator().manual_seed(group)
    x = (torch.randn(7, K, generator=g) * 10 ** torch.randn(7, 1, generator=g)).to(dtype)
    x[2, :group] = 0
    q, scale, _ = quantize_rows(x, group)
    ref_q, ref_scale = quantize(x, (1, group))
    assert q.dtype == FP8 and torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale) and scale[2, 0] == 1


@pytest.mark.parametrize("tokens", [11, 40])  # pairs per expert few (16-row tiles) or many (64-row tiles)
@pytest.mark.parametrize("block", [(16, 32), (32, 16)])  # activation groups of 32 columns; of 16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [16, 128])  # gate_up's tile columns: silu(gate) * up's group (capped at block[1])
def test_fp8_grouped_experts(monkeypatch, tokens, block, dtype, cols):
    """The grouped GEMM over expert-sorted pairs (the fused backend past the GEMVs) on FP8 experts, e4m3
    activations: the emulated math (``fp8_reference.w8a8_experts``) within fp32's order bound; in bf16 within
    2**-6 of the outputs' max (the outputs' roundings, 2**-8, and where the sums' order moves a group's
    largest silu(gate) * up to the next bf16 value, the group's scale with it: ~2**-7 of its part); near the
    reference."""
    num_experts, h, inter = 6, 72, 48  # (I = 48: a partial activation group at 32)
    for size in (16, 64):
        monkeypatch.setitem(grouped_fp8.GATE_UP_BLOCKS, size, (size, cols, 4, 2))
    experts = _fp8_experts(num_experts, h, inter, block, 8)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(tokens, h, generator=g).to(dtype)
    weights, ids = route(torch.randn(tokens, num_experts, generator=g), 2, True)
    parts = grouped_fp8_experts(
        x, experts.gate_up_proj, experts.down_proj, experts.scales(), weights.to(dtype), ids.int()
    )
    assert parts.shape == (tokens, 2, h) and parts.dtype == dtype
    dequantized = experts.dequantized(torch.float32)
    emulated = w8a8_experts(x, *dequantized, weights, ids, block[1], min(cols, block[1]))
    if dtype == torch.float32:
        torch.testing.assert_close(parts, emulated, rtol=1e-5, atol=1e-5)
    else:
        assert (parts.float() - emulated).abs().max() <= 2**-6 * emulated.abs().max()
    assert_activation_rounding(parts.float().sum(1), reference_experts(x.float(), *dequantized, weights, ids))


def _fp8_moe(block) -> SparseMoE:
    moe_layer = SparseMoE(32, 8, 2, 16, True, shared_intermediate_size=48)
    randomize(moe_layer, 5)
    moe_layer.experts.quantize(block)
    for name in ("gate_proj", "up_proj", "down_proj"):
        setattr(moe_layer.shared_expert, name, Fp8Linear.from_linear(getattr(moe_layer.shared_expert, name), block))
    return moe_layer


@pytest.mark.parametrize("max_gemv_pairs", [64, 0])  # expert GEMVs, or the grouped GEMM beyond them
@pytest.mark.parametrize("block", [(16, 16), (32, 16)])  # I = 16: whole blocks (folded), or not (beside)
def test_fp8_moe_with_its_shared_expert(monkeypatch, max_gemv_pairs, block):
    monkeypatch.setattr(moe, "MAX_GEMV_PAIRS", max_gemv_pairs)
    ref = _fp8_moe(block)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    folded = block == (16, 16)
    assert fused.experts.gate_up_proj.dtype == FP8 and (fused.shared_expert is None) == folded
    assert fused.experts.gate_up_proj.shape[0] == (8 + 3 if folded else 8)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(6))
    out = fused(x)
    assert out.shape == (5, 2 + (3 if folded else 1), 32)
    if max_gemv_pairs:
        torch.testing.assert_close(out.sum(1), ref(x), rtol=1e-5, atol=1e-5)
    else:  # (the grouped GEMM's activations in e4m3: test_fp8_grouped_experts holds it to their emulation)
        assert_activation_rounding(out.sum(1), ref(x))


def _fp8_pair(cls, *args, block):
    """(FP8 reference module, the same FP8 weights on the fused path) from the tiny config."""
    ref = cls(*args, "reference").eval()
    randomize(ref, 7)
    quantize_fp8(ref, block)
    fused = cls(*args, "fused").eval()
    quantize_fp8(fused, block, empty=True)
    fused.load_state_dict(ref.state_dict())
    use_kernels(fused, "fused")
    return ref, fused


@torch.no_grad()
@pytest.mark.parametrize("block", [(16, 16), (128, 128)])  # talker's shared expert: folded; beside the experts
def test_fp8_thinker_and_talker_fast_path_equal_reference(block):
    """The whole decoders with FP8 weights: merged projections, folded (or not) shared expert, expert
    GEMVs, every FP8 kernel in one forward, against the reference path on the same FP8 weights."""
    cfg = Qwen3OmniConfig.from_hf(load_config_dict(TINY_CONFIG))
    ref, fused = _fp8_pair(Thinker, cfg.text, cfg.tokens, cfg.talker.accept_hidden_layer, block=block)
    assert fused.model.layers[0].self_attn.qkv_proj.weight.dtype == FP8
    ids = torch.randint(0, 100, (5,), generator=torch.Generator().manual_seed(8))
    outs = []
    for model in (ref, fused):
        kv = ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu")
        outs.append(
            (model(ids, torch.arange(5), kv, all_logits=True).logits, model(ids[:1], torch.tensor([5]), kv).logits)
        )
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    ref, fused = _fp8_pair(Talker, cfg.talker, block=block)
    folded = fused.model.layers[0].mlp.shared_expert is None
    assert folded == (block == (16, 16))
    x = torch.randn(2, cfg.talker.text.hidden_size, generator=torch.Generator().manual_seed(9))
    outs = []
    for model in (ref, fused):
        kv = ContiguousKVCache.for_config(cfg.talker.text, torch.float32, "cpu")
        hidden = model.model(x, torch.arange(2), kv)
        outs.append((hidden, *model.code_predictor(hidden, hidden.flip(0), lambda logits, i: logits.argmax(-1))))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[1][1], outs[0][1])
