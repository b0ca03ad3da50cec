"""The skinny GEMM in bf16 on the GPU against cuBLAS (``F.linear``) on the decoders' real projection
shapes, at the launch configurations the fast path picks (the CPU twin is ``test_skinny_gemm.py``).

Bound (as on the CPU): both round an fp32 sum once, so an output may differ by one bf16 step
(at most 2**-7 of its value) plus the fp32 reordering bound ``2 * K * 2**-24 * sum_k |x_k * w_k|``. The gated
epilogue rounds gate and up like the reference, so a one-step difference there moves silu·up by
about a step: held to 2**-6 relative. Each test prints the share of elements that differ.
"""

import pytest
import torch
import torch.nn.functional as F

from omniwalk.kernels.add_rms_norm import add_rms_norm_triton
from omniwalk.kernels.skinny_gemm import InputNorm, normed_skinny_gemm, pick_blocks, skinny_gemm
from omniwalk.layers.moe import silu_mul_reference
from omniwalk.layers.norm import RMSNorm

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
# name: (K, N, kind); plain: [M, N]; partials: the consumer sums split-K parts; gated: N = 2I -> [M, I];
# biased: plain + a bias [N]
SHAPES = {
    "thinker qkv": (2048, 5120, "plain"),
    "thinker o": (4096, 2048, "partials"),
    "talker qkv": (1024, 2560, "plain"),
    "talker o": (2048, 1024, "partials"),
    "cp qkv": (1024, 4096, "plain"),
    "cp o": (2048, 1024, "partials"),
    "cp gate_up": (1024, 6144, "gated"),
    "cp down": (3072, 1024, "partials"),
    "qwen2.5-7b qkv": (3584, 4608, "biased"),  # (Qwen2-style: the biases added in the epilogue)
    "qwen2.5-7b o": (3584, 3584, "partials"),  # (the 7B's: TUNED's tiles, a dot tile at one row for down)
    "qwen2.5-7b gate_up": (3584, 37888, "gated"),
    "qwen2.5-7b down": (18944, 3584, "partials"),
    "qwen2.5-7b talker qkv": (896, 2560, "biased"),
    "qwen2.5-7b talker o": (1536, 896, "partials"),
    "qwen2.5-7b talker down": (18944, 896, "partials"),
}


@pytest.mark.parametrize("m", [1, 2, 8, 16, 32])
@pytest.mark.parametrize("name", list(SHAPES))
@torch.inference_mode()
def test_skinny_gemm_matches_cublas(name, m):
    k, n, kind = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(BF16)
    bias = torch.randn(n, generator=g, device="cuda").to(BF16) if kind == "biased" else None
    out = skinny_gemm(x, w, gated=kind == "gated", partials=kind == "partials", bias=bias)
    ref = F.linear(x, w, bias)
    if kind == "gated":
        ref = silu_mul_reference(ref)
        differ = (out != ref).float().mean().item()
        print(f"GPU-SKINNY {name} M={m}: {out.shape} differ {differ:.4%} from cuBLAS + silu·mul")
        torch.testing.assert_close(out, ref, rtol=2**-6, atol=2**-8)
        return
    split = out.shape[1] if out.dim() == 3 else 1
    y = out.sum(1) if out.dim() == 3 else out.float()
    bound = ref.float().abs() * 2**-7 + 2 * k * 2**-24 * F.linear(x.float().abs(), w.float().abs())
    err = (y - ref.float()).abs()
    differ = (y.to(BF16) != ref).float().mean().item()
    print(
        f"GPU-SKINNY {name} M={m} split={split}: differ {differ:.4%} from cuBLAS, "
        f"max error {(err / bound).max().item():.2f} of the bound"
    )
    assert (err <= bound).all()


# the GEMVs a norm folds into (``SkinnyLinear.normed``): name -> (N, gated); K = 1024 (hidden)
FOLDED = {"talker qkv": (2560, False), "cp qkv": (4096, False), "cp gate_up": (6144, True), "cp lm_head": (2048, False)}


@pytest.mark.parametrize("parts", [None, 0, 4])  # None: a plain norm; 0: a bf16 delta [1, K]; 4: fp32 partials
@pytest.mark.parametrize("name", list(FOLDED))
@torch.inference_mode()
def test_folded_norm_equals_the_norm_kernel_then_the_gemv(name, parts):
    """normed_skinny_gemm at the fast path's tile against the two kernels it replaces (add_rms_norm_triton,
    skinny_gemm): h + delta bitwise; the product bitwise where the tile has the norm kernel's 4 warps (the
    same rounding steps, the row's sum of squares reduced in the same order). With other warps that fp32 sum
    runs in another order: a normalised element may then round one bf16 step apart (as the norm kernel's
    may against PyTorch's), moving the product by about that: held to one step of it plus 2e-3."""
    (n, gated), k = FOLDED[name], 1024
    g = torch.Generator(device="cuda").manual_seed(len(name) + (parts or 0))
    h = torch.randn(1, k, generator=g, device="cuda").to(BF16)
    delta = None if parts is None else torch.randn(1, *([parts] if parts else []), k, generator=g, device="cuda")
    delta = delta.to(BF16) if parts == 0 else delta
    norm = RMSNorm(k).to("cuda", BF16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    w = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(BF16)
    h_out, y = normed_skinny_gemm(InputNorm(h, delta, norm.weight, norm.eps), w, gated=gated)
    h_two, x = add_rms_norm_triton(h, delta, norm.weight, norm.eps)
    y_two = skinny_gemm(x, w, gated=gated)
    ref_h, ref_x = norm.add(h, delta)
    print(
        f"GPU-FOLD {name} parts={parts}: vs the two kernels differ h {(h_out != h_two).float().mean().item():.4%} "
        f"y {(y != y_two).float().mean().item():.4%}; norm vs PyTorch differ {(x != ref_x).float().mean().item():.4%}"
    )
    assert torch.equal(h_out, h_two)
    if pick_blocks(1, n // 2 if gated else n, k, gated, False).warps == 4:
        assert torch.equal(y, y_two)
    else:
        torch.testing.assert_close(y, y_two, rtol=2**-7, atol=2e-3)
    assert torch.equal(h_out, ref_h)
    torch.testing.assert_close(x, ref_x, rtol=8e-3, atol=8e-3)  # (one bf16 step where fp32 sums reorder)
    if not gated:
        ref = F.linear(x, w)
        bound = ref.float().abs() * 2**-7 + 2 * k * 2**-24 * F.linear(x.float().abs(), w.float().abs())
        assert ((y.float() - ref.float()).abs() <= bound).all()


@pytest.mark.parametrize("m", [1, 32])
@pytest.mark.parametrize("name", ["thinker qkv", "thinker o", "qwen2.5-7b qkv"])
@torch.inference_mode()
def test_extra_rows_leave_the_product_bitwise_and_equal_their_own_launch(name, m):
    """A LoRA pool's A rows (4 slots x 48) in the projection's GEMV at the fast path's tile: the projection's
    output bitwise as without them, theirs bitwise as the rows' own launch with that tile."""
    from omniwalk.kernels.skinny_gemm import skinny_gemm_with_rows

    k, n, kind = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(BF16)
    rows = (torch.randn(192, k, generator=g, device="cuda") * k**-0.5).to(BF16)
    bias = torch.randn(n, generator=g, device="cuda").to(BF16) if kind == "biased" else None
    partials = kind == "partials"
    blocks = pick_blocks(m, n, k, False, partials, False, x.device)
    if blocks is None:
        pytest.skip(f"{name} at M={m} runs cuBLAS on this device (no GEMV to fold into)")
    y, t = skinny_gemm_with_rows(x, w, rows, partials=partials, blocks=blocks, bias=bias)
    assert torch.equal(y, skinny_gemm(x, w, partials=partials, blocks=blocks, bias=bias))
    assert torch.equal(t, skinny_gemm(x, rows, partials=partials, blocks=blocks))
