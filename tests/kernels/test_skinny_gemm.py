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
from helpers import triton_cpu

from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels.add_rms_norm import add_rms_norm_triton
from omniwalk.kernels.skinny_gemm import Blocks, InputNorm, skinny_gemm, skinny_gemm_with_rows
from omniwalk.layers.linear import SkinnyLinear
from omniwalk.layers.moe import GatedMLP, silu_mul_reference
from omniwalk.layers.norm import RMSNorm

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
    monkeypatch.setattr(sg, "tuned_blocks", lambda *_: {sg._key(1, N, K, False, False): sg.CUBLAS})  # (cuBLAS faster)
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
    norm.use_fused_kernel()
    for a, b in zip(norm.add(h, delta), expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _norm_operands(parts, seed: int = 5):
    """h [1, K], a delta (None; a part in h's dtype [1, K]; fp32 split-K partials [1, S, K]), an RMSNorm."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(1, K, generator=g).to(torch.bfloat16)
    delta = None if parts is None else torch.randn(1, *([parts] if parts else []), K, generator=g)
    delta = delta.to(torch.bfloat16) if parts == 0 else delta
    norm = RMSNorm(K).to(torch.bfloat16)
    norm.weight.data = (1 + 0.1 * torch.randn(K, generator=g)).to(torch.bfloat16)
    return h, delta, norm


@pytest.mark.parametrize("parts", [None, 0, 3])  # None: a plain norm; 0: a delta [1, K]; 3: fp32 partials
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("blocks", BLOCKS)  # (K steps of 64 and 128 over K = 200: the row re-read per step)
def test_folded_norm_equals_the_norm_kernel_then_the_product(parts, gated, blocks):
    """normed_skinny_gemm = add_rms_norm_triton, then skinny_gemm on its output, bitwise (the same rounding
    steps, the row's statistics over the same block); and within the product's bound of the reference."""
    h, delta, norm = _norm_operands(parts)
    _, w = _operands(1, torch.bfloat16, n=2 * N if gated else N, seed=6)
    h_out, y = sg.normed_skinny_gemm(InputNorm(h, delta, norm.weight, norm.eps), w, gated=gated, blocks=blocks)
    expected_h, x = add_rms_norm_triton(h, delta, norm.weight, norm.eps)
    assert torch.equal(h_out, expected_h) and torch.equal(y, skinny_gemm(x, w, gated=gated, blocks=blocks))
    assert (h_out is h) == (delta is None)
    ref_h, ref_x = norm.add(h, delta)  # (the reference backend: PyTorch)
    assert torch.equal(h_out, ref_h) and torch.equal(x, ref_x)
    if not gated:
        _assert_within_order_bound(y, ref_x, w)


def test_folded_norm_wants_one_unpadded_row():
    h, delta, norm = _norm_operands(0)
    _, w = _operands(1, torch.bfloat16)
    fold = InputNorm(h.expand(2, K), delta, norm.weight, norm.eps)
    with pytest.raises(ValueError, match="one row"):
        sg.normed_skinny_gemm(fold, w, blocks=BLOCKS[0])
    with pytest.raises(ValueError, match="one row"):
        sg.normed_skinny_gemm(fold._replace(h=h), w, blocks=Blocks(16, 64, 1, 4, 2, rows=16))


@pytest.mark.parametrize(
    "rows, parts, backend, folds",
    [
        (1, None, "triton", True),
        (1, 0, "triton", True),
        (1, 0, "reference", False),
        (2, 0, "triton", False),
        (1, 4, "triton", False),
        (1, 8, "triton", False),
    ],  # (4 split-K partials; 8 in h's dtype: the MoE's)
)
def test_module_folds_the_norm_at_one_row(monkeypatch, rows, parts, backend, folds):
    h, delta, norm = _norm_operands(parts, seed=7)
    if parts == 8:
        delta = delta.to(torch.bfloat16)
    h, delta = h.expand(rows, K).contiguous(), None if delta is None else delta.expand(rows, *delta.shape[1:])
    linear = SkinnyLinear(_operands(1, torch.bfloat16, seed=8)[1])
    calls = []
    fold = sg.normed_skinny_gemm
    monkeypatch.setattr(sg, "normed_skinny_gemm", lambda *a, **k: calls.append(1) or fold(*a, **k))
    norm.kernel = add_rms_norm_triton if backend == "triton" else None
    h_out, y = linear.normed(norm, h, delta)
    assert bool(calls) == folds
    norm.kernel = None
    expected_h, x = norm.add(h, delta)
    assert torch.equal(h_out, expected_h) and torch.equal(y, linear(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])  # the GEMV lanes; tl.dot
def test_bias_is_added_before_the_one_rounding(dtype, m):
    """A biased product (Qwen2-style q/k/v) = F.linear with its bias: the sum + bias rounded once."""
    x, w = _operands(m, dtype, seed=10)
    b = torch.randn(N, generator=torch.Generator().manual_seed(11)).to(dtype)
    y = skinny_gemm(x, w, blocks=BLOCKS[0], bias=b)
    exact = F.linear(x.double(), w.double(), b.double())
    bound = 2 * K * 2**-24 * F.linear(x.double().abs(), w.double().abs()) + exact.abs() * 2**-23  # (+ the add's)
    if dtype == torch.bfloat16:
        bound = bound + exact.abs() * 2**-8  # (half a step: one rounding of the biased sum)
    assert ((y.double() - exact).abs() <= bound + 1e-30).all()
    assert not torch.equal(y, skinny_gemm(x, w, blocks=BLOCKS[0]))


def test_bias_goes_with_a_plain_unsplit_product_only():
    x, w = _operands(1, torch.bfloat16, seed=12)
    b = torch.zeros(N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="never split"):
        skinny_gemm(x, w, partials=True, blocks=Blocks(16, 32, 2, 4, 2), bias=b)
    with pytest.raises(ValueError, match="ungated"):
        skinny_gemm(x, w, gated=True, blocks=BLOCKS[0], bias=b[: N // 2])
    with pytest.raises(ValueError, match="plain product"):
        SkinnyLinear(w, partials=True, bias=b)
    biased, plain = torch.nn.Linear(K, 8), torch.nn.Linear(K, 8, bias=False)
    with pytest.raises(ValueError, match="all have biases"):
        SkinnyLinear.merge(biased, plain)


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 2, sg.MAX_ROWS + 1])  # the norm folded into the GEMV; the kernel; cuBLAS
def test_merged_biased_projections(rows):
    """q/k/v Linears with biases merged into one SkinnyLinear: each part's output, biases included, from the
    kernel (its norm folded in at one row) and from F.linear beyond MAX_ROWS."""
    g = torch.Generator().manual_seed(13)
    parts = [torch.nn.Linear(K, n) for n in (32, 16, 16)]
    for p in parts:
        p.weight.data.normal_(0, K**-0.5, generator=g)
        p.bias.data.normal_(0, 1, generator=g)
    merged = SkinnyLinear.merge(*parts)
    h, delta, norm = _norm_operands(0, seed=14)
    h, delta = h.float().expand(rows, K), delta.float().expand(rows, K)
    norm, x = norm.float(), norm.float().add(h, delta)[1]
    norm.use_fused_kernel()
    ref = torch.cat([p(x) for p in parts], dim=-1)
    torch.testing.assert_close(merged(x), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged.normed(norm, h, delta)[1], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("biased", [False, True])
def test_extra_rows_are_their_own_product_in_the_same_launch(dtype, m, split, biased):
    """The weight's product exactly as without the rows (bias, split partial sums), and the rows' product
    exactly as a launch of the rows alone with the same tiles (no bias): the same programs' arithmetic."""
    if biased and split > 1:
        return  # (a biased product is never split)
    x, w = _operands(m, dtype)
    rows = _operands(1, dtype, n=40, seed=5)[1]
    bias = torch.randn(N, generator=torch.Generator().manual_seed(6)).to(dtype) if biased else None
    blocks = Blocks(16, 64, split, 4, 2)
    y, t = skinny_gemm_with_rows(x, w, rows, partials=split > 1, blocks=blocks, bias=bias)
    assert torch.equal(y, skinny_gemm(x, w, partials=split > 1, blocks=blocks, bias=bias))
    assert torch.equal(t, skinny_gemm(x, rows, partials=split > 1, blocks=blocks))
    assert t.shape == ((m, split, 40) if split > 1 else (m, 40))


def test_extra_rows_are_refused_unless_plain_rows_of_the_weights_dtype():
    x, w = _operands(1, torch.float32)
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm_with_rows(x, w, torch.zeros(8, K + 1))
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm_with_rows(x, w, torch.zeros(8, K, dtype=torch.bfloat16))
