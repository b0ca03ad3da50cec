"""Varlen attention backends against each other and against plain per-segment softmax attention."""

import math
from itertools import pairwise

import pytest
import torch

from omniwalk.errors import ConfigError
from omniwalk.kernels.registry import ATTENTION
from omniwalk.layers.attention import varlen_attention


def _packed(lengths, heads, kv_heads, head_dim, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, head_dim, generator=g).to(device, dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0, *lengths]).cumsum(0).to(device=device, dtype=torch.int32)
    return q, k, v, cu, max(lengths)


def _naive(q, k, v, cu, causal, scale):
    """Explicit softmax(q k^T * scale) v per segment, in fp64."""
    out = torch.empty_like(q, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    bounds = cu.tolist()
    for s, e in pairwise(bounds):
        qs, ks, vs = (
            q[s:e].double(),
            k[s:e].double().repeat_interleave(group, 1),
            v[s:e].double().repeat_interleave(group, 1),
        )
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            scores = scores.masked_fill(
                torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).triu(1), float("-inf")
            )
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs)
    return out


LAYOUTS = {
    "one": [37],
    "ragged": [1, 5, 64, 3, 100, 17],
    "many": [((i * 7919) % 23) + 1 for i in range(64)],
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("head_dim", [64, 72])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_naive_softmax(layout, head_dim, heads, kv_heads, causal):
    q, k, v, cu, max_len = _packed(LAYOUTS[layout], heads, kv_heads, head_dim, torch.float32)
    scale = head_dim**-0.5
    out = varlen_attention(q, k, v, cu, max_len, causal=causal, scale=scale, backend="reference")
    torch.testing.assert_close(out.double(), _naive(q, k, v, cu, causal, scale), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_masked_backend_matches_reference(layout, dtype, causal):
    q, k, v, cu, max_len = _packed(LAYOUTS[layout], 8, 2, 72, dtype)
    ref = varlen_attention(q, k, v, cu, max_len, causal=causal, scale=0.1, backend="reference")
    out = varlen_attention(q, k, v, cu, max_len, causal=causal, scale=0.1, backend="masked")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_unknown_backend_and_bad_heads_raise():
    q, k, v, cu, max_len = _packed([4], 4, 4, 64, torch.float32)
    with pytest.raises(ConfigError, match="attention_backend must be one of"):
        varlen_attention(q, k, v, cu, max_len, causal=False, scale=1.0, backend="nope")
    with pytest.raises(ValueError, match="multiple"):
        varlen_attention(q, k[:, :3], v[:, :3], cu, max_len, causal=False, scale=1.0)
    assert {"reference", "masked", "torch_varlen"} <= set(ATTENTION.names())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("head_dim", [64, 72])
@pytest.mark.parametrize("heads,kv_heads", [(16, 16), (32, 4)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_backends_match_reference(layout, head_dim, heads, kv_heads, causal, dtype):
    q, k, v, cu, max_len = _packed(LAYOUTS[layout], heads, kv_heads, head_dim, dtype, device="cuda")
    scale = 1 / math.sqrt(head_dim)
    ref = _naive(q.float(), k.float(), v.float(), cu, causal, scale).float()
    for backend in ("reference", "masked", "torch_varlen"):
        out = varlen_attention(q, k, v, cu, max_len, causal=causal, scale=scale, backend=backend)
        assert out.shape == q.shape and out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2, msg=backend)


def _chunks_after_cache(device, dtype, heads=8, kv_heads=2, head_dim=64):
    """Prompt chunks of n_i queries after m_i - n_i cached tokens: q packed by n_i, k/v by m_i."""
    n, m = [3, 1, 17, 40, 5], [3, 30, 17, 90, 64]
    q, _, _, cu_q, max_q = _packed(n, heads, kv_heads, head_dim, dtype, device, seed=1)
    _, k, v, cu_k, max_k = _packed(m, heads, kv_heads, head_dim, dtype, device, seed=2)
    return q, k, v, cu_q, cu_k, max_q, max_k


def _naive_after_cache(q, k, v, cu_q, cu_k, scale):
    """Per segment, fp64: query j (of n) sees keys 0 .. m - n + j (of m)."""
    group, out = q.shape[1] // k.shape[1], torch.empty_like(q, dtype=torch.float64)
    for (s, e), (ks_, ke) in zip(pairwise(cu_q.tolist()), pairwise(cu_k.tolist()), strict=True):
        n, m = e - s, ke - ks_
        qs = q[s:e].double()
        ks, vs = (t[ks_:ke].double().repeat_interleave(group, 1) for t in (k, v))
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        hidden = torch.arange(m, device=q.device)[None, :] > torch.arange(m - n, m, device=q.device)[:, None]
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.masked_fill(hidden, float("-inf")).softmax(-1), vs)
    return out


@pytest.mark.parametrize("backend", ["reference", "masked"])
def test_keys_with_their_own_offsets_align_causal_masks_bottom_right(backend):
    q, k, v, cu_q, cu_k, max_q, max_k = _chunks_after_cache("cpu", torch.float32)
    scale = 64**-0.5
    out = varlen_attention(
        q, k, v, cu_q, max_q, causal=True, scale=scale, backend=backend, cu_seqlens_k=cu_k, max_seqlen_k=max_k
    )
    torch.testing.assert_close(out.double(), _naive_after_cache(q, k, v, cu_q, cu_k, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_keys_with_their_own_offsets(dtype):
    """The CUDA kernel on prompt chunks after cached tokens (the engine's packed prefill)."""
    q, k, v, cu_q, cu_k, max_q, max_k = _chunks_after_cache("cuda", dtype)
    scale = 64**-0.5
    ref = _naive_after_cache(q.float(), k.float(), v.float(), cu_q, cu_k, scale).float()
    for backend in ("reference", "masked", "torch_varlen"):
        out = varlen_attention(
            q, k, v, cu_q, max_q, causal=True, scale=scale, backend=backend, cu_seqlens_k=cu_k, max_seqlen_k=max_k
        )
        err = (out.float() - ref).abs().max().item()
        print(f"GPU-PARITY packed prefill attention {backend} {dtype}: max abs {err:.2e}")
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2, msg=backend)
