"""Every FP8 kernel on the GPU against its dequantised reference, at the decoders' real shapes (the
CPU twin, through Triton's interpreter, is ``test_fp8_kernels.py``).

Widening (``kernels/fp8.widen``, the inline PTX: paired e4m3x2 -> f16x2 converts, f16 -> f32): every
one of the 256 byte values against torch's e4m3 -> fp32, exactly (NaN where NaN).

Skinny GEMM: the GEMV (one row) sums w * scale * x in fp32 and rounds once to bf16, so against the product
with the weight dequantised in fp32 it is within half a bf16 step (2**-9 of the value) plus the fp32
reordering bound ``3 * K * 2**-24 * sum_k |x_k * w_k|``; the ``tl.dot`` path (more rows) multiplies the weight
dequantised to bf16 (``fp8.dequantize``'s values), held to the same bound against that product. Against cuBLAS
on the weight dequantised to bf16 (the bf16 model built from the FP8 weights) each test prints the share of
outputs that differ. MoE (expert GEMVs): as
``test_fused_gpu.py``'s (fp32 sum over experts vs the reference's bf16 steps: the gate/up, activation and
expert outputs rounded to bf16 from sums in another order, then summed in bf16 steps), held to four bf16
steps (2**-6) of the output's max: the largest seen was 1.21e-2 (thinker, 8 tokens, fp8w's call; 1% had
failed there on unseeded inputs), a wrong scale or route is far off it. The grouped GEMM (past the GEMVs)
rounds its activations to e4m3 too: held to that math emulated in fp32, and near the reference.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.triton_cpu import assert_activation_rounding, w8a8_experts

from omniwalk.kernels import grouped_fp8
from omniwalk.kernels.fp8 import asm_widening, dequantize_triton
from omniwalk.kernels.grouped_fp8 import grouped_fp8_experts, quantize_rows
from omniwalk.kernels.skinny_gemm import Blocks, skinny_gemm
from omniwalk.layers import moe
from omniwalk.layers.fp8 import FP8, Fp8Linear, dequantize, quantize
from omniwalk.layers.linear import SkinnyLinear
from omniwalk.layers.moe import SparseMoE, silu_mul_reference
from omniwalk.models.common.checkpoint.loader import randomize

pytestmark = pytest.mark.gpu
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


@pytest.mark.parametrize("shape", [(1, 2048), (1024, 2048), (300, 768)])
def test_activation_quantiser_is_fp8_quantize_bitwise(shape):
    x = (torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(shape[0])) * 3).to(BF16)
    q, scale, _ = quantize_rows(x, 128)
    ref_q, ref_scale = quantize(x, (1, 128))
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(scale, ref_scale)


@pytest.mark.parametrize("name", ["thinker qkv", "thinker o", "cp gate_up"])
def test_dequantize_kernel_is_the_reference_bitwise(name):
    """Prefill-sized products multiply this copy: every value as the reference dequantises it."""
    k, parts, _ = SHAPES[name]
    w = torch.randn(sum(parts), k, device="cuda", generator=torch.Generator("cuda").manual_seed(4)) * k**-0.5
    q, scale = quantize(w, BLOCK)
    assert torch.equal(dequantize_triton(q, scale, BLOCK, BF16), dequantize(q, scale, BLOCK, BF16))
