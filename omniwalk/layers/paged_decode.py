"""Decode attention over paged KV: one new query per request, a whole batch in one launch.

    q        [B, heads, d]             the batch's new queries (one token per request)
    keys     [slots, kv_heads, d]      a layer's paged storage (slot = page * page_size + offset)
    table    [B, max_pages] int32      each request's pages, in order (entries past its length unused)
    lens     [B] int32                 keys per request, the new token's included (0 = padding row)
    -> out   [B, heads, d]

Backends: ``reference`` gathers each request's keys and calls the same causal attention as the
contiguous cache (the oracle; reads ``lens`` on the host; ``semaphores`` unused); ``triton`` is
one kernel over (request, kv head, split) programs with an online softmax over blocks of keys,
reading lengths and pages on the device: no host synchronisation, fixed shapes, so it can be
captured in a CUDA graph.

Splits: a small batch has few (request, kv head) rows, so each row's keys are cut into up to
``splits`` spans of whole blocks (fixed per call by the batch size, the split count a row
actually uses by its length: a row of one block stays one program and writes its output
directly). Split programs write partials (max, sum, weighted values; fp32) and the last of a
row's programs to finish (an atomic counter per row, left at zero) merges them: no second kernel.
"""

from __future__ import annotations

import functools

import torch

from omniwalk.layers import pdl
from omniwalk.layers.kv_attention import causal_attention


def paged_decode_reference(q, keys, values, table, lens, page_size: int, semaphores=None) -> torch.Tensor:
    out = torch.zeros_like(q)
    for row, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        pages = table[row, : -(-n // page_size)].long()
        slots = (pages[:, None] * page_size + torch.arange(page_size, device=q.device)).flatten()[:n]
        k, v = keys[slots].transpose(0, 1), values[slots].transpose(0, 1)
        out[row] = causal_attention(q[row, :, None], k, v)[:, 0]
    return out


@functools.cache
def _kernel():
    """The kernel; its module is imported on first use (CPU installs lack Triton)."""
    from omniwalk.layers import paged_decode_triton

    return paged_decode_triton.paged_decode


# (keys per block, warps) of a program; rows (request, kv head) split into up to MAX_SPLITS programs
# each while the batch has fewer than DECODE_PROGRAMS / 2 rows; rows of at most 32 keys (the code
# predictor's) use blocks of 32. H200, benchmarks/paged_decode.py (k2 call 1), µs per call incl.
# the graph's gap, thinker B=1 at 130 / 207 / 512 / 2048 keys: 5.3 / 5.4 / 6.2 / 9.4 (not split:
# 5.8 / 6.8 / 11.1 / 37.6); 17 keys, one block of 32: 3.1 (of 64: 3.8).
DECODE_BLOCKS = (64, 4)
DECODE_PROGRAMS = 128
MAX_SPLITS = 8


def num_splits(rows: int, max_keys: int, block: int, programs: int = DECODE_PROGRAMS) -> int:
    """Programs per (request, kv head) row: enough to fill ``programs``, at most one per block of keys."""
    return max(1, min(MAX_SPLITS, programs // rows, -(-max_keys // block)))


def paged_decode_triton(
    q, keys, values, table, lens, page_size: int, semaphores: torch.Tensor | None = None,
    blocks: tuple[int, int] = DECODE_BLOCKS, programs: int = DECODE_PROGRAMS,
) -> torch.Tensor:  # fmt: skip
    """``semaphores``: int32 zeros [>= programs // 2], left zero, one set per concurrently running
    caller (``KVStorage.semaphores``): rows are then split over programs; None: one program per row."""
    batch, heads, d = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    group_pad = max(16, 1 << (group - 1).bit_length())
    out = torch.empty_like(q)
    block, warps = blocks
    max_keys = table.shape[1] * page_size
    block = min(block, max(32, 1 << (max_keys - 1).bit_length()))
    rows = batch * kv_heads
    splits = 1 if semaphores is None else num_splits(rows, max_keys, block, programs)
    parts = out
    if splits > 1:
        if rows > semaphores.numel():
            raise ValueError(f"paged decode: {rows} rows split but {semaphores.numel()} semaphores")
        parts = torch.empty(rows * splits * group_pad * (d + 2), dtype=torch.float32, device=q.device)
    _kernel()[(batch, kv_heads, splits)](
        q, keys, values, table, lens, out, parts, semaphores if splits > 1 else lens,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), table.stride(0), out.stride(0), out.stride(1),
        d**-0.5,
        KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=group_pad, D=d, PAGE=page_size, BLOCK=block, SPLITS=splits,
        num_warps=warps, **pdl.launch(q.device),
    )  # fmt: skip
    return out


DECODE_BACKENDS = {"reference": paged_decode_reference, "triton": paged_decode_triton}
