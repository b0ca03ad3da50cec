"""The skinny GEMM (``kernels/skinny_gemm.py``) against ``F.linear`` and the reference gated MLP, on the
CPU through Triton's interpreter; in bf16 on the GPU (``gpu``) against cuBLAS on the decoders' real
projection shapes, at the launch configurations the fast path picks.

Bounds: in fp32 only the order of the K-term sums differs, so each output is within
``2 * K * 2**-24 * sum_k |x_k * w_k|`` of F.linear's (twice the classical bound of one recursive sum
in any order). In bf16 the kernel rounds its fp32 sum once, so it is within that plus half a bf16
step of the exact product; a step is at most 2**-7 of the value (8 significant bits). Against cuBLAS,
which rounds an fp32 sum once too, an output may differ by one bf16 step plus the reordering bound. The
gated epilogue rounds gate and up like the reference, so a one-step difference there moves silu·up by
about a step: held to 2**-6 relative. Each GPU test prints the share of elements that differ.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers.triton_cpu import CPU_ONLY

from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels.add_rms_norm import add_rms_norm_triton
from omniwalk.kernels.skinny_gemm import (
    Blocks,
    InputNorm,
    normed_skinny_gemm,
    pick_blocks,
    skinny_gemm,
    skinny_gemm_with_rows,
)
from omniwalk.layers.linear import SkinnyLinear
from omniwalk.layers.moe import GatedMLP, silu_mul_reference
from omniwalk.layers.norm import RMSNorm

K, N = 200, 72  # (off every block size: masks on K and N)
BLOCKS = [Blocks(16, 64, 1, 4, 2), Blocks(32, 128, 1, 4, 2)]


def _operands(m: int, dtype: torch.dtype, n: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, K, generator=g).to(dtype), (torch.randn(n, K, generator=g) * K**-0.5).to(dtype)


def _assert_within_order_bound(ours: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(x.float(), w.float())
    bound = 2 * K * 2**-24 * F.linear(x.float().abs(), w.float().abs())
    if x.dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2**-7
    assert ((ours.float() - ref).abs() <= bound + 1e-30).all()


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16, 17])  # 1: the GEMV lanes; else tl.dot with M padded to 16 or 32
@pytest.mark.parametrize("blocks", BLOCKS)
def test_plain_product(interpreter, dtype, m, blocks):
    x, w = _operands(m, dtype)
    y = skinny_gemm(x, w, blocks=blocks)
    assert y.shape == (m, N) and y.dtype == dtype
    _assert_within_order_bound(y, x, w)
    if dtype == torch.bfloat16:  # the same as F.linear's bf16 product up to one step
        torch.testing.assert_close(y, F.linear(x, w))


@CPU_ONLY
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [2, 3])
def test_split_partials_sum_to_the_product(interpreter, m, split):
    x, w = _operands(m, torch.bfloat16, seed=1)
    parts = skinny_gemm(x, w, partials=True, blocks=Blocks(16, 32, split, 4, 2))
    assert parts.shape == (m, split, N) and parts.dtype == torch.float32
    _assert_within_order_bound(parts.sum(1), x, w)
    with pytest.raises(ValueError, match="partials"):
        skinny_gemm(x, w, blocks=Blocks(16, 32, split, 4, 2))


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 4])
def test_gated_product_is_silu_mul_of_the_merged_projection(interpreter, dtype, m):
    x, w = _operands(m, dtype, n=2 * 40, seed=2)
    act = skinny_gemm(x, w, gated=True, blocks=BLOCKS[0])
    assert act.shape == (m, 40)
    ref = silu_mul_reference(F.linear(x, w))  # (gate and up rounded to the dtype first, as here)
    if dtype == torch.float32:
        torch.testing.assert_close(act, ref, rtol=1e-5, atol=1e-5)
    else:  # a one-step difference in gate or up moves the product by about one step
        torch.testing.assert_close(act, ref, rtol=2**-6, atol=2**-8)


@CPU_ONLY
def test_module_uses_the_kernel_up_to_max_rows_and_cublas_beyond(interpreter, monkeypatch):
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


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 3, sg.MAX_ROWS + 2])
def test_merged_gated_mlp_with_partial_sums_through_the_fused_norm(interpreter, monkeypatch, rows):
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


@CPU_ONLY
@pytest.mark.parametrize("parts", [None, 0, 3])  # None: a plain norm; 0: a delta [1, K]; 3: fp32 partials
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("blocks", BLOCKS)  # (K steps of 64 and 128 over K = 200: the row re-read per step)
def test_folded_norm_equals_the_norm_kernel_then_the_product(interpreter, parts, gated, blocks):
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


@CPU_ONLY
def test_folded_norm_wants_one_unpadded_row(interpreter):
    h, delta, norm = _norm_operands(0)
    _, w = _operands(1, torch.bfloat16)
    fold = InputNorm(h.expand(2, K), delta, norm.weight, norm.eps)
    with pytest.raises(ValueError, match="one row"):
        sg.normed_skinny_gemm(fold, w, blocks=BLOCKS[0])
    with pytest.raises(ValueError, match="one row"):
        sg.normed_skinny_gemm(fold._replace(h=h), w, blocks=Blocks(16, 64, 1, 4, 2, rows=16))


@CPU_ONLY
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
def test_module_folds_the_norm_at_one_row(interpreter, monkeypatch, rows, parts, backend, folds):
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


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])  # the GEMV lanes; tl.dot
def test_bias_is_added_before_the_one_rounding(interpreter, dtype, m):
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


@CPU_ONLY
def test_bias_goes_with_a_plain_unsplit_product_only(interpreter):
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


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 2, sg.MAX_ROWS + 1])  # the norm folded into the GEMV; the kernel; cuBLAS
def test_merged_biased_projections(interpreter, rows):
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


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("biased", [False, True])
def test_extra_rows_are_their_own_product_in_the_same_launch(interpreter, dtype, m, split, biased):
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


@CPU_ONLY
def test_extra_rows_are_refused_unless_plain_rows_of_the_weights_dtype(interpreter):
    x, w = _operands(1, torch.float32)
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm_with_rows(x, w, torch.zeros(8, K + 1))
    with pytest.raises(ValueError, match="rows"):
        skinny_gemm_with_rows(x, w, torch.zeros(8, K, dtype=torch.bfloat16))


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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
    # (the tile SkinnyLinear.with_rows takes: the generic one where the bare product's tuned entry is cuBLAS)
    blocks = pick_blocks(m, n, k, False, partials, False, x.device) or sg.default_blocks(m, n, k, partials)
    y, t = skinny_gemm_with_rows(x, w, rows, partials=partials, blocks=blocks, bias=bias)
    assert torch.equal(y, skinny_gemm(x, w, partials=partials, blocks=blocks, bias=bias))
    assert torch.equal(t, skinny_gemm(x, rows, partials=partials, blocks=blocks))
