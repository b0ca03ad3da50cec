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

from omniwalk.layers.silu_mul import silu_mul_reference
from omniwalk.layers.skinny_gemm import skinny_gemm

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
# name: (K, N, kind); plain: [M, N]; partials: the consumer sums split-K parts; gated: N = 2I -> [M, I]
SHAPES = {
    "thinker qkv": (2048, 5120, "plain"),
    "thinker o": (4096, 2048, "partials"),
    "talker qkv": (1024, 2560, "plain"),
    "talker o": (2048, 1024, "partials"),
    "cp qkv": (1024, 4096, "plain"),
    "cp o": (2048, 1024, "partials"),
    "cp gate_up": (1024, 6144, "gated"),
    "cp down": (3072, 1024, "partials"),
}


@pytest.mark.parametrize("m", [1, 2, 8, 16])
@pytest.mark.parametrize("name", list(SHAPES))
@torch.inference_mode()
def test_skinny_gemm_matches_cublas(name, m):
    k, n, kind = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(BF16)
    out = skinny_gemm(x, w, gated=kind == "gated", partials=kind == "partials")
    ref = F.linear(x, w)
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
