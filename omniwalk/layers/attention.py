"""Variable-length (packed) attention; its implementations are the registry ``ATTENTION`` (``attention_backend``).

Many sequences are packed along the token axis; ``cu_seqlens`` ([num_segments + 1] int32,
starting at 0, ending at the number of tokens) marks where each segment starts. Attention
never crosses a segment boundary; with ``causal`` a token sees only earlier tokens of its own
segment. q is [tokens, heads, head_dim]; k/v are [tokens, kv_heads, head_dim] with ``heads`` a
multiple of ``kv_heads`` (GQA). The output has q's shape and dtype.

Keys may have their own offsets (``cu_seqlens_k``): segment i then has n_i queries and m_i >= n_i
keys, the queries being the last n_i positions (a prompt chunk after m_i - n_i cached tokens), and
``causal`` aligns the mask to the bottom right: query j sees keys 0 .. m_i - n_i + j.

Implementations (``kernels/registry.ATTENTION``, chosen by name from config, never by environment):

    name          runs on     host sync   notes
    reference     CPU / GPU   yes         SDPA per segment; the test oracle
    masked        CPU / GPU   no          one SDPA call with a block-diagonal mask; O(tokens^2)
    torch_varlen  CUDA        no          torch.nn.attention.varlen.varlen_attn (flash); fp16/bf16
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cache
from itertools import accumulate, pairwise

import torch
import torch.nn.functional as F

from omniwalk.device import to_device
from omniwalk.kernels.registry import ATTENTION


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool,
    scale: float,
    backend: str = "reference",
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_k: int | None = None,
) -> torch.Tensor:
    """Attention over packed segments (see the module docstring for shapes).

    ``max_seqlen`` is the longest segment; kernels size their launch grid from it, so it must be
    a Python int known without reading ``cu_seqlens`` back from the device. Keys share the
    queries' offsets unless ``cu_seqlens_k`` / ``max_seqlen_k`` are given.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if cu_seqlens_k is None:
        cu_seqlens_k, max_seqlen_k = cu_seqlens, max_seqlen
    attend = ATTENTION.load(backend)
    return attend(q, k, v, cu_seqlens, cu_seqlens_k, max_seqlen, max_seqlen_k, causal, scale)


def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    """Segment lengths (host ints) -> ``cu_seqlens`` [len + 1] int32 on ``device``."""
    return to_device(list(accumulate(lengths, initial=0)), device, torch.int32)


def reference_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    gqa = q.shape[1] != k.shape[1]
    out = torch.empty_like(q)
    for (start, end), (k_start, k_end) in zip(pairwise(cu_q.tolist()), pairwise(cu_k.tolist()), strict=True):
        if end == start:
            continue
        # SDPA wants [heads, tokens, head_dim]
        qs = q[start:end].transpose(0, 1)
        ks, vs = (t[k_start:k_end].transpose(0, 1) for t in (k, v))
        n, m = end - start, k_end - k_start
        mask = None
        if causal and m != n:  # bottom-right: the queries are the last n of m positions
            mask = torch.arange(m, device=q.device)[None, :] <= torch.arange(m - n, m, device=q.device)[:, None]
        o = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=gqa
        )
        out[start:end] = o.transpose(0, 1)
    return out


def segment_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[tokens] index of the segment each packed token belongs to (no host sync)."""
    positions = torch.arange(num_tokens, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)


def masked_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    seg_q, seg_k = segment_ids(cu_q, q.shape[0]), segment_ids(cu_k, k.shape[0])
    mask = seg_q[:, None] == seg_k[None, :]
    if causal:  # key position in its segment <= query position + (m_i - n_i)
        pos_q = torch.arange(q.shape[0], device=q.device) - cu_q[seg_q]
        pos_k = torch.arange(k.shape[0], device=k.device) - cu_k[seg_k]
        shift = (cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1])
        mask &= pos_k[None, :] <= (pos_q + shift[seg_q])[:, None]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return o.transpose(0, 1)


@cache
def _torch_varlen_kernel():
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    # NOTE: torch 2.11 has window_size but no enable_gqa, and passes keys/values with fewer heads to the
    # flash kernel, which shares them among query heads itself (outputs bitwise equal to repeated ones,
    # and faster than repeating them); later versions ask for the flag.
    return varlen_attn, "enable_gqa" in params


def torch_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    kernel, has_gqa = _torch_varlen_kernel()
    extra = {"enable_gqa": True} if has_gqa and q.shape[1] != k.shape[1] else {}
    # flash attention aligns causal masks and windows to the bottom right (queries last)
    window = (-1, 0) if causal else (-1, -1)
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    return kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window, **extra)
