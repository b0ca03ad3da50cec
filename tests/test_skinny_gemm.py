"""The skinny GEMM (``layers/skinny_gemm.py``) against ``F.linear`` and the reference gated MLP, on the
CPU through Triton's interpreter. The GPU twin (bf16, full-size shapes) is ``test_skinny_gemm_gpu.py``.

Bounds: in fp32 only the order of the K-term sums differs, so each output is within
``2 * K * 2**-24 * sum_k |x_k * w_k|`` of F.linear's (twice the classical bound of one recursive sum
in any order). In bf16 the kernel rounds its fp32 sum once, so it is within that plus half a bf16
step of the exact product; a step is at most 2**-7 of the value (8 significant bits).
"""

import pytest
import torch
import torch.nn.functional as F
import triton_cpu

from omniwalk.layers import skinny_gemm as sg
from omniwalk.layers.moe import GatedMLP
from omniwalk.layers.norm import RMSNorm
from omniwalk.layers.silu_mul import silu_mul_reference
from omniwalk.layers.skinny_gemm import Blocks, SkinnyLinear, skinny_gemm

pytestmark = pytest.mark.skipif(not triton_cpu.ON_CPU, reason="interpreter tests run on the CPU machine")
K, N = 200, 72  # (off every block size: masks on K and N)
BLOCKS = [Blocks(16, 64, 1, 4, 2), Blocks(32, 128, 1, 4, 2)]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    yield from triton_cpu.interpreted(monkeypatch)


def _operands(m: int, dtype: torch.dtype, n: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(dtype), (torch.randn(n, K, generator=g) * K**-0.5).to(dtype)


def _assert_within_order_bound(ours: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(x.float(), w.float())
    bound = 2 * K * 2**-24 * F.linear(x.float().abs(), w.float().abs())
    if x.dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2**-7
    assert ((ours.float() - ref).abs() <= bound + 1e-30).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16, 17])  # 1: the GEMV lanes; else tl.dot with M padded to 16 or 32
@pytest.mark.parametrize("blocks", BLOCKS)
def test_plain_product(dtype, m, blocks):
    x, w = _operands(m, dtype)
    y = skinny_gemm(x, w, blocks=blocks)
    assert y.shape == (m, N) and y.dtype == dtype
    _assert_within_order_bound(y, x, w)
    if dtype == torch.bfloat16:  # the same as F.linear's bf16 product up to one step
        torch.testing.assert_close(y, F.linear(x, w))


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [2, 3])
def test_split_partials_sum_to_the_product(m, split):
    x, w = _operands(m, torch.bfloat16, seed=1)
    parts = skinny_gemm(x, w, partials=True, blocks=Blocks(16, 32, split, 4, 2))
    assert parts.shape == (m, split, N) and parts.dtype == torch.float32
    _assert_within_order_bound(parts.sum(1), x, w)
    with pytest.raises(ValueError, match="partials"):
        skinny_gemm(x, w, blocks=Blocks(16, 32, split, 4, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4])
def test_gated_product_is_silu_mul_of_the_merged_projection(dtype, m):
    x, w = _operands(m, dtype, n=2 * 40, seed=2)
    act = skinny_gemm(x, w, gated=True, blocks=BLOCKS[0])
    assert act.shape == (m, 40)
    ref = silu_mul_reference(F.linear(x, w))  # (gate and up rounded to the dtype first, as here)
    if dtype == torch.float32:
        torch.testing.assert_close(act, ref, rtol=1e-5, atol=1e-5)
    else:  # a one-step difference in gate or up moves the product by about one step
        torch.testing.assert_close(act, ref, rtol=2**-6, atol=2**-8)


def test_module_uses_the_kernel_up_to_max_rows_and_cublas_beyond(monkeypatch):
    x, w = _operands(sg.MAX_ROWS + 1, torch.float32, seed=3)
    linear = SkinnyLinear(w)
    calls = []
    monkeypatch.setattr(sg, "skinny_gemm", lambda *a, **k: calls.append(a[0].shape[0]) or skinny_gemm(*a, **k))
    assert torch.equal(linear(x), F.linear(x, w)) and not calls  # more rows than MAX_ROWS: F.linear
    _assert_within_order_bound(linear(x[:2]), x[:2], w)
    y3 = linear(x[:4].view(2, 2, K))  # leading dimensions kept
    assert y3.shape == (2, 2, N) and calls == [2, 4]
    monkeypatch.setitem(sg.TUNED, (1, N, K, False, False), None)  # (where cuBLAS measured faster)
    assert torch.equal(linear(x[:1]), F.linear(x[:1], w)) and calls == [2, 4]


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 3, sg.MAX_ROWS + 2])
def test_merged_gated_mlp_with_partial_sums_through_the_fused_norm(monkeypatch, rows):
    """GatedMLP.merge_projections on the fast path: gate/up gated in the kernel, down split into
    partials that the next fused add + RMSNorm sums; equal to the reference MLP + add + norm."""
    monkeypatch.setattr(sg, "pick_blocks", lambda m, n, k, gated, split, *_: Blocks(16, 32, 3 if split else 1, 4, 2))
    g = torch.Generator().manual_seed(4)
    ref = GatedMLP(48, 40)
    for p in ref.parameters():
        p.normal_(0.0, 0.2, generator=g)
    fused = GatedMLP(48, 40, partial_output=True)
    fused.load_state_dict(ref.state_dict())
    fused.merge_projections()
    x, h = torch.randn(2, rows, 48, generator=g)
    norm = RMSNorm(48)
    expected = norm.add(h, ref(x))
    delta = fused(x)
    assert delta.shape == ((rows, 3, 48) if rows <= sg.MAX_ROWS else (rows, 48))
    norm.backend = "triton"
    for a, b in zip(norm.add(h, delta), expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
