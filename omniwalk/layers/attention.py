"""Variable-length (packed) attention behind a small backend registry.

Many sequences are packed along the token axis; ``cu_seqlens`` ([num_segments + 1] int32,
starting at 0, ending at the number of tokens) marks where each segment starts. Attention
never crosses a segment boundary; with ``causal`` a token sees only earlier tokens of its own
segment. q is [tokens, heads, head_dim]; k/v are [tokens, kv_heads, head_dim] with ``heads`` a
multiple of ``kv_heads`` (GQA). The output has q's shape and dtype.

Backends (chosen by name from config, never by environment):

    name          runs on     host sync   notes
    reference     CPU / GPU   yes         SDPA per segment; the test oracle
    masked        CPU / GPU   no          one SDPA call with a block-diagonal mask; O(tokens^2)
    torch_varlen  CUDA        no          torch.nn.attention.varlen.varlen_attn (flash); fp16/bf16
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import cache
from itertools import accumulate, pairwise

import torch
import torch.nn.functional as F

from omniwalk.device import to_device
from omniwalk.errors import ConfigError

# (q, k, v, cu_seqlens, max_seqlen, causal, scale) -> out
AttentionBackend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool, float], torch.Tensor]
_BACKENDS: dict[str, AttentionBackend] = {}


def register_backend(name: str) -> Callable[[AttentionBackend], AttentionBackend]:
    """Decorator: make ``fn`` selectable as ``backend=name``."""

    def add(fn: AttentionBackend) -> AttentionBackend:
        _BACKENDS[name] = fn
        return fn

    return add


def available_backends() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))


def get_backend(name: str) -> AttentionBackend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(available_backends())}") from None


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
) -> torch.Tensor:
    """Attention over packed segments (see the module docstring for shapes).

    ``max_seqlen`` is the longest segment; kernels size their launch grid from it, so it must be
    a Python int known without reading ``cu_seqlens`` back from the device.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    return get_backend(backend)(q, k, v, cu_seqlens, max_seqlen, causal, scale)


def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    """Segment lengths (host ints) -> ``cu_seqlens`` [len + 1] int32 on ``device``."""
    return to_device(list(accumulate(lengths, initial=0)), device, torch.int32)


@register_backend("reference")
def _reference(q, k, v, cu_seqlens, max_seqlen, causal, scale):
    bounds = cu_seqlens.tolist()
    gqa = q.shape[1] != k.shape[1]
    out = torch.empty_like(q)
    for start, end in pairwise(bounds):
        if end == start:
            continue
        # SDPA wants [heads, tokens, head_dim]
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa)
        out[start:end] = o.transpose(0, 1)
    return out


def segment_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[tokens] index of the segment each packed token belongs to (no host sync)."""
    positions = torch.arange(num_tokens, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)


@register_backend("masked")
def _masked(q, k, v, cu_seqlens, max_seqlen, causal, scale):
    num_tokens = q.shape[0]
    seg = segment_ids(cu_seqlens, num_tokens)
    mask = seg[:, None] == seg[None, :]
    if causal:
        mask = mask.tril()
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
    # NOTE: torch 2.11 (the GPU machine) has window_size but no enable_gqa; later versions add it.
    return varlen_attn, "enable_gqa" in params


@register_backend("torch_varlen")
def _torch_varlen(q, k, v, cu_seqlens, max_seqlen, causal, scale):
    kernel, has_gqa = _torch_varlen_kernel()
    extra = {}
    if q.shape[1] != k.shape[1]:
        if has_gqa:
            extra["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    cu = cu_seqlens.to(torch.int32)
    window = (-1, 0) if causal else (-1, -1)
    return kernel(q, k, v, cu, cu, max_seqlen, max_seqlen, scale=scale, window_size=window, **extra)
