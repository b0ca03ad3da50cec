"""The FP8 kernels (the skinny GEMM's and the expert GEMVs' FP8-weight variants, the grouped GEMM,
dequantisation, activation quantisation, e4m3 widening) against their dequantised reference: on the CPU
through Triton's interpreter, and on the GPU (``gpu``) at the decoders' real shapes.

The kernels read e4m3 weights and apply each block's scale inside the sum: to a sub-block's partial sum
(the GEMV and the expert GEMVs) or to the weight tile before ``tl.dot`` (``fp8.dequantize``'s values). In fp32
that differs from ``F.linear`` of the dequantised weight only in rounding order: each output is within
``3 * K * 2**-24 * sum_k |x_k * w_k|`` of it (the order bound of the skinny GEMM tests, plus one
rounding of each scaled term).

On the GPU: widening (``kernels/fp8.widen``, the inline PTX: paired e4m3x2 -> f16x2 converts, f16 -> f32):
every one of the 256 byte values against torch's e4m3 -> fp32, exactly (NaN where NaN).
Skinny GEMM: the GEMV (one row) sums w * scale * x in fp32 and rounds once to bf16, so against the product
with the weight dequantised in fp32 it is within half a bf16 step (2**-9 of the value) plus the fp32
reordering bound; the ``tl.dot`` path (more rows) multiplies the weight dequantised to bf16, held to the same
bound against that product. Against cuBLAS on the weight dequantised to bf16 (the bf16 model built from the
FP8 weights) each test prints the share of outputs that differ. MoE (expert GEMVs): as the bf16 MoE's GPU test
in ``test_fused_kernels.py`` (fp32 sum over experts vs the reference's bf16 steps: the gate/up, activation and
expert outputs rounded to bf16 from sums in another order, then summed in bf16 steps), held to four bf16
steps (2**-6) of the output's max: the largest seen was 1.21e-2 (thinker, 8 tokens, fp8w's call; 1% had
failed there on unseeded inputs), a wrong scale or route is far off it. The grouped GEMM (past the GEMVs)
rounds its activations to e4m3 too: held to that math emulated in fp32, and near the reference.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.single_request import ContiguousKVCache
from helpers.triton_cpu import CPU_ONLY, assert_activation_rounding, w8a8_experts

from omniwalk.kernels import grouped_fp8
from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels.fp8 import asm_widening, dequantize_triton
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

K, N = 200, 72  # (off every block size: masks, partial scale blocks)


def _weight(n: int, k: int, block, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5 * (1 + 3 * torch.rand(n, 1, generator=g))  # (rows of unlike scales)
    q, scale = quantize(w, block)
    return q, scale, dequantize(q, scale, block, torch.float32)


def _assert_within_bound(ours: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(x, w)
    bound = 3 * x.shape[-1] * 2**-24 * F.linear(x.abs(), w.abs())
    assert ((ours - ref).abs() <= bound + 1e-30).all(), (ours - ref).abs().max()


@CPU_ONLY
@pytest.mark.parametrize("block", [(16, 32), (32, 64), (128, 128)])
@pytest.mark.parametrize("m", [1, 3, 17])  # the GEMV lanes; tl.dot with rows padded to 16, 32
@pytest.mark.parametrize("blocks", [Blocks(16, 64, 1, 4, 2), Blocks(32, 128, 1, 4, 2), Blocks(8, 256, 1, 4, 1)])
def test_fp8_product(interpreter, block, m, blocks):
    """Row blocks inside one scale row (scales broadcast) and across scale rows (per-row scales);
    K steps shorter and longer than a scale block."""
    q, scale, w = _weight(N, K, block)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    y = skinny_gemm(x, q, blocks=blocks, scale=scale, scale_block=block)
    assert y.shape == (m, N) and y.dtype == torch.float32
    _assert_within_bound(y, x, w)


@CPU_ONLY
@pytest.mark.parametrize("block", [(16, 32), (128, 128)])
@pytest.mark.parametrize("m", [3, 17])
def test_fp8_dot_path_multiplies_the_weight_dequantised_to_bf16(interpreter, block, m):
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


@CPU_ONLY
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [2, 3])
def test_fp8_split_partials_and_gated(interpreter, m, split):
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


@CPU_ONLY
@pytest.mark.parametrize("block", [(16, 32), (128, 128), (48, 80)])  # (48, 80): partial edge blocks both ways
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_kernel_equals_the_reference(interpreter, block, dtype):
    """The prefill products' dequantised copy: the reference's values exactly (fp32 product, one rounding)."""
    q, scale, _ = _weight(N + 9, K, block)
    assert torch.equal(dequantize_triton(q, scale, block, dtype), dequantize(q, scale, block, dtype))


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("rows", [3, sg.MAX_ROWS + 2])
def test_merged_fp8_projections_equal_the_reference_modules(interpreter, monkeypatch, rows):
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


@CPU_ONLY
@pytest.mark.parametrize("block", [(16, 32), (8, 16), (128, 128)])
def test_fp8_expert_gemv(interpreter, block):
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


@CPU_ONLY
@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantiser_is_fp8_quantize(interpreter, group, dtype):
    """The grouped GEMM's activations, e4m3 per row and group of columns: ``quantize(x, (1, group))``'s bytes
    and scales exactly (K = 200: a partial last group; an all-zero group keeps scale 1)."""
    g = torch.Generator().manual_seed(group)
    x = (torch.randn(7, K, generator=g) * 10 ** torch.randn(7, 1, generator=g)).to(dtype)
    x[2, :group] = 0
    q, scale, _ = quantize_rows(x, group)
    ref_q, ref_scale = quantize(x, (1, group))
    assert q.dtype == FP8 and torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale) and scale[2, 0] == 1


@CPU_ONLY
@pytest.mark.parametrize("tokens", [11, 40])  # pairs per expert few (16-row tiles) or many (64-row tiles)
@pytest.mark.parametrize("block", [(16, 32), (32, 16)])  # activation groups of 32 columns; of 16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [16, 128])  # gate_up's tile columns: silu(gate) * up's group (capped at block[1])
def test_fp8_grouped_experts(interpreter, monkeypatch, tokens, block, dtype, cols):
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


@CPU_ONLY
@pytest.mark.parametrize("max_gemv_pairs", [64, 0])  # expert GEMVs, or the grouped GEMM beyond them
@pytest.mark.parametrize("block", [(16, 16), (32, 16)])  # I = 16: whole blocks (folded), or not (beside)
def test_fp8_moe_with_its_shared_expert(interpreter, monkeypatch, max_gemv_pairs, block):
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


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("block", [(16, 16), (128, 128)])  # talker's shared expert: folded; beside the experts
def test_fp8_thinker_and_talker_fast_path_equal_reference(interpreter, block):
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


BF16 = torch.bfloat16
BLOCK = (128, 128)
# name: (K, parts' rows, kind); parts are merged like the fast path merges them
SHAPES = {
    "thinker qkv": (2048, (4096, 512, 512), "plain"),
    "thinker o": (4096, (2048,), "partials"),
    "talker qkv": (1024, (2048, 256, 256), "plain"),
    "talker o": (2048, (1024,), "partials"),
    "cp qkv": (1024, (2048, 1024, 1024), "plain"),
    "cp gate_up": (1024, (3072, 3072), "gated"),
    "cp down": (3072, (1024,), "partials"),
}


def _widen_kernel():
    import triton
    import triton.language as tl

    from omniwalk.kernels.fp8 import widen

    @triton.jit
    def copy_widened(q_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, widen(tl.load(q_ptr + offs)))

    return copy_widened


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [1, 4])
def test_e4m3_widening_is_exact_for_every_byte(warps):
    """The PTX widening of the FP8 GEMV on all 256 e4m3 bit patterns (each 16 times, in 16-byte runs per
    thread as the GEMV loads them) equals torch's conversion exactly; the two NaN codes stay NaN."""
    q = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8).repeat_interleave(16).view(FP8)
    assert asm_widening(q.device)
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    _widen_kernel()[(q.numel() // 1024,)](q, out, BLOCK=1024, num_warps=warps)
    ref = q.float()
    assert torch.equal(out.isnan(), ref.isnan()) and int(ref.isnan().sum()) == 2 * 16
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())
    assert torch.equal(out.view(torch.int32)[~ref.isnan()], ref.view(torch.int32)[~ref.isnan()])  # (signed zeros too)


def _merged(k: int, rows: tuple[int, ...], kind: str, seed: int) -> SkinnyLinear:
    g = torch.Generator(device="cuda").manual_seed(seed)
    parts = []
    for n in rows:
        w = torch.randn(n, k, generator=g, device="cuda") * k**-0.5 * (1 + torch.rand(n, 1, generator=g, device="cuda"))
        parts.append(Fp8Linear(*quantize(w, BLOCK), BLOCK))
    return SkinnyLinear.merge(*parts, gated=kind == "gated", partials=kind == "partials")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 8, 16, 32])
@pytest.mark.parametrize("name", list(SHAPES))
@torch.inference_mode()
def test_fp8_skinny_gemm_matches_the_dequantised_product(name, m):
    k, rows, kind = SHAPES[name]
    linear = _merged(k, rows, kind, seed=m)
    assert linear.weight.dtype == FP8 and linear.block == BLOCK
    x = torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(100 + m)).to(BF16)
    out = skinny_gemm(
        x,
        linear.weight,
        gated=linear.gated,
        partials=linear.partials,
        scale=linear.weight_scale_inv,
        scale_block=linear.block,
    )
    w32 = dequantize(linear.weight, linear.weight_scale_inv, linear.block, torch.float32)
    xs = x.float()
    cublas = F.linear(x, w32.to(BF16))  # the bf16 model of the dequantised weights
    if m > 1:  # (tl.dot: the tile dequantised to bf16 first, as that model's weights are)
        w32 = w32.to(BF16).float()
    if kind == "gated":
        ref = silu_mul_reference(F.linear(xs, w32).to(BF16))
        differ = (out != silu_mul_reference(cublas)).float().mean().item()
        print(f"GPU-FP8 {name} M={m} : differ {differ:.4%} from cuBLAS on dequantised bf16 + silu·mul")
        torch.testing.assert_close(out, ref, rtol=2**-6, atol=2**-8)
        return
    y = out.sum(1) if out.dim() == 3 else out.float()
    ref = F.linear(xs, w32)
    bound = ref.abs() * 2**-8 + 3 * k * 2**-24 * F.linear(xs.abs(), w32.abs())
    err = (y - ref).abs()
    differ = (y.to(BF16) != cublas).float().mean().item()
    cos = F.cosine_similarity(y.flatten(), cublas.float().flatten(), dim=0).item()
    print(
        f"GPU-FP8 {name} M={m} : max error {(err / bound).max().item():.2f} of the bound; "
        f"vs cuBLAS on dequantised bf16: differ {differ:.4%}, cosine {cos:.6f}"
    )
    assert (err <= bound).all()


# M = 1 launch configurations beside the tables' picks: 4/8 warps, one step or a loop over K, split
# (partial sums), row blocks inside one scale row or across scale rows (a (16, 128) block grid)
GEMV_TILES = [Blocks(8, 1024, 1, 4, 1), Blocks(16, 1024, 2, 8, 1), Blocks(32, 256, 2, 4, 4), Blocks(64, 128, 1, 4, 1)]
GEMV_TILES += [Blocks(16, 512, 1, 4, 1), Blocks(4, 2048, 2, 4, 1)]  # (TUNED_FP8's)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [BLOCK, (16, 128)])
@pytest.mark.parametrize("tile", GEMV_TILES, ids=str)
@pytest.mark.parametrize("name", ["thinker o", "cp gate_up"])
@torch.inference_mode()
def test_fp8_gemv_tiles_match_the_dequantised_product(name, tile, block):
    k, rows, kind = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(11)
    parts = []
    for n in rows:
        w = torch.randn(n, k, generator=g, device="cuda") * k**-0.5 * (1 + torch.rand(n, 1, generator=g, device="cuda"))
        parts.append(Fp8Linear(*quantize(w, block), block))
    linear = SkinnyLinear.merge(*parts, gated=kind == "gated", partials=kind == "partials")
    x = torch.randn(1, k, device="cuda", generator=g).to(BF16)
    partials = kind == "partials" and tile.split > 1
    tile = tile if kind == "partials" else tile._replace(split=1)
    out = skinny_gemm(
        x,
        linear.weight,
        gated=linear.gated,
        partials=partials,
        blocks=tile,
        scale=linear.weight_scale_inv,
        scale_block=linear.block,
    )
    w32 = dequantize(linear.weight, linear.weight_scale_inv, linear.block, torch.float32)
    if kind == "gated":
        torch.testing.assert_close(out, silu_mul_reference(F.linear(x.float(), w32).to(BF16)), rtol=2**-6, atol=2**-8)
        return
    y = out.sum(1) if out.dim() == 3 else out.float()
    ref = F.linear(x.float(), w32)
    assert ((y - ref).abs() <= ref.abs() * 2**-8 + 3 * k * 2**-24 * F.linear(x.float().abs(), w32.abs())).all()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, hidden, experts, top_k, inter, shared",
    [("thinker", 2048, 128, 8, 768, 0), ("talker", 1024, 128, 6, 384, 768)],
)
@pytest.mark.parametrize("tokens", [1, 8, 32, 512])  # 32 tokens: past MAX_GEMV_PAIRS, the FP8 grouped GEMM
@torch.inference_mode()
def test_fp8_moe_matches_the_dequantised_reference(name, hidden, experts, top_k, inter, shared, tokens):
    with torch.device("cuda"):
        ref = SparseMoE(hidden, experts, top_k, inter, True, shared).to(BF16)
    randomize(ref, 3)
    ref.experts.quantize(BLOCK)
    if shared:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            setattr(ref.shared_expert, proj, Fp8Linear.from_linear(getattr(ref.shared_expert, proj), BLOCK))
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    assert fused.shared_expert is None or not shared
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(BF16)
    out = fused(x).float().sum(1).to(BF16)
    expected = ref(x)  # the reference MoE on the dequantised bf16 weights
    err = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    path = "GEMV" if tokens * (top_k + fused.num_shared) <= moe.MAX_GEMV_PAIRS else "grouped"
    print(f"GPU-FP8 MoE {name} tokens={tokens} ({path}): max error {err:.2e} of the output's max")
    if path == "GEMV":
        assert err < 2**-6
    else:  # (e4m3 activations: held to their emulation by test_fp8_grouped_gemm_is_its_emulation)
        assert_activation_rounding(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, hidden, experts, top_k, inter", [("thinker", 2048, 128, 8, 768), ("talker", 1024, 128, 6, 384)]
)
@pytest.mark.parametrize("tokens", [32, 1024])  # a B = 32 decode step (16-row tiles), a prefill chunk (64-row tiles)
@torch.inference_mode()
def test_fp8_grouped_gemm_is_its_emulation(name, hidden, experts, top_k, inter, tokens):
    """The grouped GEMM with e4m3 activations against its math in fp32 (``fp8_reference.w8a8_experts``): the
    difference's norm within 2**-7 of the output's (the outputs' bf16 roundings; where the sums' order or
    silu's approximate exp moves an activation to the next bf16 value, it can move to the next e4m3 value
    or, as a group's largest, move the group's scale: the max error is heavy-tailed, 1.48e-2 of the output's
    max at 1,024 thinker tokens, held to 2**-5); against the reference that multiplies
    the bf16 activations: within their e4m3 rounding."""
    with torch.device("cuda"):
        layer = SparseMoE(hidden, experts, top_k, inter, True).to(BF16)
    randomize(layer, 5)
    layer.experts.quantize(BLOCK)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(BF16)
    weights, ids = moe.route(layer.gate(x), top_k, True)
    fp8_experts = layer.experts
    parts = grouped_fp8_experts(
        x, fp8_experts.gate_up_proj, fp8_experts.down_proj, fp8_experts.scales(), weights, ids.int()
    )
    dequantized = fp8_experts.dequantized(torch.float32)
    size = 16 if tokens * top_k <= 8 * experts else 64  # (grouped_gemm's pick)
    emulated = w8a8_experts(x, *dequantized, weights, ids, 128, min(128, grouped_fp8.GATE_UP_BLOCKS[size][1]))
    diff = parts.float() - emulated
    err, norm = (diff.abs().max() / emulated.abs().max()).item(), (diff.norm() / emulated.norm()).item()
    print(f"GPU-FP8 grouped {name} tokens={tokens}: max error {err:.2e} of the emulation's max, norm {norm:.2e}")
    assert norm < 2**-7 and err < 2**-5
    assert_activation_rounding(parts.float().sum(1), moe.reference_experts(x.float(), *dequantized, weights, ids))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 2048), (1024, 2048), (300, 768)])
def test_activation_quantiser_is_fp8_quantize_bitwise(shape):
    x = (torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(shape[0])) * 3).to(BF16)
    q, scale, _ = quantize_rows(x, 128)
    ref_q, ref_scale = quantize(x, (1, 128))
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(scale, ref_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["thinker qkv", "thinker o", "cp gate_up"])
def test_dequantize_kernel_is_the_reference_bitwise(name):
    """Prefill-sized products multiply this copy: every value as the reference dequantises it."""
    k, parts, _ = SHAPES[name]
    w = torch.randn(sum(parts), k, device="cuda", generator=torch.Generator("cuda").manual_seed(4)) * k**-0.5
    q, scale = quantize(w, BLOCK)
    assert torch.equal(dequantize_triton(q, scale, BLOCK, BF16), dequantize(q, scale, BLOCK, BF16))
