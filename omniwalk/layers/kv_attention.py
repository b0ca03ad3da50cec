"""Causal attention of a block of new queries against one request's cached keys (reference path).

Shapes are SDPA's: q [heads, n, d]; k, v [kv_heads, m, d] where the n queries are the last n of
the m positions (``m - n`` were cached before); or all three with a leading batch dimension (rows
of equal length). Used by the per-request contiguous cache and the
engine's paged batches alike, so both compute exactly the same thing.

``paged_decode_reference`` is the decode attention over paged KV in these terms (the registry entry
``decode_attention="reference"``; the oracle of ``kernels/paged_decode.py``, whose docstring gives the
shapes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# NOTE: not cuDNN: it rebuilds its execution plan for every new key length, milliseconds of host time
# per call in decode (most of a full-size step's host time; docs/performance.md).
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """-> [heads, n, d] (or [B, heads, n, d]). Scale head_dim^-0.5; GQA by head groups."""
    n, m = q.shape[-2], k.shape[-2]
    mask, is_causal = None, False
    if n > 1 and m == n:
        is_causal = True  # a block from position 0: plain causal (lets SDPA pick the flash kernel)
    elif n > 1:
        keys = torch.arange(m, device=q.device)
        mask = keys[None, :] <= torch.arange(m - n, m, device=q.device)[:, None]
    batched = q.dim() == 4
    q, k, v = (q, k, v) if batched else (q[None], k[None], v[None])
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    return out if batched else out[0]


def paged_decode_reference(q, keys, values, table, lens, page_size: int, semaphores=None) -> torch.Tensor:
    """q [B, heads, d], keys/values [slots, kv_heads, d], table [B, pages], lens [B] -> [B, heads, d]: each
    row's keys gathered from its pages, then ``causal_attention`` (reads ``lens`` on the host;
    ``semaphores`` unused)."""
    out = torch.zeros_like(q)
    for row, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        pages = table[row, : -(-n // page_size)].long()
        slots = (pages[:, None] * page_size + torch.arange(page_size, device=q.device)).flatten()[:n]
        k, v = keys[slots].transpose(0, 1), values[slots].transpose(0, 1)
        out[row] = causal_attention(q[row, :, None], k, v)[:, 0]
    return out
