"""Every FP8 kernel on the GPU against its dequantised reference, at the decoders' real shapes (the
CPU twin, through Triton's interpreter, is ``test_fp8_kernels.py``).

Skinny GEMM: the kernel sums w * scale * x in fp32 and rounds once to bf16, so against the product
with the weight dequantised in fp32 it is within half a bf16 step (2**-9 of the value) plus the fp32
reordering bound ``3 * K * 2**-24 * sum_k |x_k * w_k|``. Against cuBLAS on the weight dequantised to bf16 (the
bf16 model built from the FP8 weights) each test prints the share of outputs that differ. MoE: as
``test_fused_gpu.py``'s (fp32 sum over experts vs the reference's bf16 steps), held to 1% of the scale.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from omniwalk.layers import moe
from omniwalk.layers.fp8 import FP8, Fp8Linear, dequantize, quantize
from omniwalk.layers.moe import SparseMoE
from omniwalk.layers.silu_mul import silu_mul_reference
from omniwalk.layers.skinny_gemm import SkinnyLinear, skinny_gemm
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
        x, linear.weight, gated=linear.gated, partials=linear.partials, scale=linear.weight_scale_inv,
        scale_block=linear.block,
    )  # fmt: skip
    w32 = dequantize(linear.weight, linear.weight_scale_inv, linear.block, torch.float32)
    xs = x.float()
    cublas = F.linear(x, w32.to(BF16))  # the bf16 model of the dequantised weights
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
    x = torch.randn(tokens, hidden, device="cuda").to(BF16)
    out = fused(x).float().sum(1).to(BF16)
    expected = ref(x)  # the reference MoE on the dequantised bf16 weights
    err = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    path = "GEMV" if tokens * (top_k + fused.num_shared) <= moe.MAX_GEMV_PAIRS else "grouped"
    print(f"GPU-FP8 MoE {name} tokens={tokens} ({path}): max error {err:.2e} of the output's max")
    assert err < 1e-2
