"""Decode attention over paged KV: one new query per request, a whole batch in one launch.

    q        [B, heads, d]             the batch's new queries (one token per request)
    keys     [slots, kv_heads, d]      a layer's paged storage (slot = page * page_size + offset)
    table    [B, max_pages] int32      each request's pages, in order (entries past its length unused)
    lens     [B] int32                 keys per request, the new token's included (0 = padding row)
    -> out   [B, heads, d]

The reference (``layers/kv_attention.paged_decode_reference``) gathers each request's keys and
calls the same causal attention as the contiguous cache (the oracle; reads ``lens`` on the host);
``paged_decode_triton`` is one kernel over (request, kv head, split) programs with an online softmax
over blocks of keys, reading lengths and pages on the device: no host synchronisation, fixed shapes,
so it can be captured in a CUDA graph. The registry entry ``decode_attention="triton"``.

Splits: a small batch has few (request, kv head) rows, so each row's keys are cut into up to
``splits`` spans of whole blocks (fixed per call by the batch size, the split count a row
actually uses by its length: a row of one block stays one program and writes its output
directly). Split programs write partials (max, sum, weighted values; fp32) and the last of a
row's programs to finish (an atomic counter per row, left at zero) merges them: no second kernel.

Launch configuration: (keys per block, warps) from the device's tuned file
(``configs/paged_decode,device_name=<GPU>.json``, ``tuned.py``), else ``DECODE_BLOCKS``; rows of at
most 32 keys (the code predictor's) use blocks of 32. Rows (request, kv head) split into up to
``MAX_SPLITS`` programs each while the batch has fewer than ``DECODE_PROGRAMS / 2`` rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl, tuned
from omniwalk.kernels.tuned import DECODE_PROGRAMS

DECODE_BLOCKS = (64, 4)  # (keys per block, warps) where the device has no tuned file
MAX_SPLITS = 8


def num_splits(rows: int, max_keys: int, block: int, programs: int = DECODE_PROGRAMS) -> int:
    """Programs per (request, kv head) row: enough to fill ``programs``, at most one per block of keys."""
    return max(1, min(MAX_SPLITS, programs // rows, -(-max_keys // block)))


def paged_decode_triton(
    q,
    keys,
    values,
    table,
    lens,
    page_size: int,
    semaphores: torch.Tensor | None = None,
    blocks: tuple[int, int] | None = None,
    programs: int = DECODE_PROGRAMS,
) -> torch.Tensor:
    """q [B, heads, d], keys/values [slots, kv_heads, d], table [B, pages] int32, lens [B] int32 -> [B, heads, d].
    ``semaphores``: int32 zeros [>= programs // 2], left zero, one set per concurrently running
    caller (``KVStorage.semaphores``): rows are then split over programs; None: one program per row.
    ``blocks``: (keys per block, warps); None: the device's (``decode_blocks``)."""
    assert q.dim() == 3 and keys.dim() == 3 and keys.shape == values.shape, "q [B, heads, d], keys [slots, kv_heads, d]"
    assert q.shape[1] % keys.shape[1] == 0, "query heads a multiple of kv heads"
    assert table.dim() == 2 and lens.shape == (q.shape[0],), "table [B, pages], lens [B]"
    batch, heads, d = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    group_pad = max(16, 1 << (group - 1).bit_length())
    out = torch.empty_like(q)
    block, warps = blocks or decode_blocks(q.device)
    max_keys = table.shape[1] * page_size
    block = min(block, max(32, 1 << (max_keys - 1).bit_length()))
    rows = batch * kv_heads
    splits = 1 if semaphores is None else num_splits(rows, max_keys, block, programs)
    parts = out
    if splits > 1:
        if rows > semaphores.numel():
            raise ValueError(f"paged decode: {rows} rows split but {semaphores.numel()} semaphores")
        parts = torch.empty(rows * splits * group_pad * (d + 2), dtype=torch.float32, device=q.device)
    paged_decode_kernel[(batch, kv_heads, splits)](
        q,
        keys,
        values,
        table,
        lens,
        out,
        parts,
        semaphores if splits > 1 else lens,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        table.stride(0),
        out.stride(0),
        out.stride(1),
        d**-0.5,
        KV_HEADS=kv_heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        D=d,
        PAGE=page_size,
        BLOCK=block,
        SPLITS=splits,
        num_warps=warps,
        **pdl.launch(q.device),
    )
    return out


def decode_blocks(device) -> tuple[int, int]:
    """(keys per block, warps) on ``device``: its tuned entry, else ``DECODE_BLOCKS``."""
    entry = tuned.configs("paged_decode", tuned.device_of(device)).get("any")
    return DECODE_BLOCKS if entry is None else (entry["block"], entry["warps"])


@triton.jit
def attend_span(
    q,
    k_ptr,
    v_ptr,
    pages,
    kvh,
    begin,
    end,
    scale,
    stride_ks,
    stride_kh,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Online softmax of one row's queries q [GROUP_PAD, D] over its keys [begin, end) (kv head
    ``kvh``, pages listed at ``pages``) -> (m, total, acc): running max, sum of weights, weighted
    values (fp32)."""
    d = tl.arange(0, D)
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, D), tl.float32)
    pos = begin + tl.arange(0, BLOCK)
    page = tl.load(pages + pos // PAGE, mask=pos < end, other=0)
    for start in range(begin, end, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        valid = pos < end
        slot = (page.to(tl.int64) * PAGE + pos % PAGE) * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + slot[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        # the next block's pages, read while this block's keys are on their way
        page = tl.load(pages + (pos + BLOCK) // PAGE, mask=pos + BLOCK < end, other=0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return m, total, acc


@triton.jit
def merge_splits(parts, used, GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """The ``used`` splits' partials of a row (split s at parts + s * GROUP_PAD * (D + 2): m, total,
    acc) merged -> the row's outputs [GROUP_PAD, D] (fp32)."""
    d = tl.arange(0, D)
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    total = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, D), tl.float32)
    for i in tl.static_range(SPLITS):
        part = parts + i * GROUP_PAD * (D + 2)
        m_i = tl.load(part, mask=used > i, other=float("-inf"), cache_modifier=".cg")
        total_i = tl.load(part + 1, mask=used > i, other=0.0, cache_modifier=".cg")
        acc_i = tl.load(part[:, None] + 2 + d[None, :], mask=used > i, other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, m_i)  # (finite: split 0 always has keys)
        alpha, beta = tl.exp(m - m_new), tl.exp(m_i - m_new)
        total = total * alpha + total_i * beta
        acc = acc * alpha[:, None] + acc_i * beta[:, None]
        m = m_new
    return acc / total[:, None]


@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    out_ptr,
    part_ptr,
    sem_ptr,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_tb,
    stride_ob,
    stride_oh,
    scale,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    b, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    n = tl.load(lens_ptr + b)
    # split s takes keys [s * span, (s + 1) * span) in whole blocks, so a short row uses fewer splits
    span = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK) * BLOCK
    used = tl.maximum(tl.cdiv(n, tl.maximum(span, 1)), 1)  # (a padding row, n = 0: split 0 writes zeros)
    if split < used:
        g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
        heads = kvh * GROUP + g
        q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :]
        q = tl.load(q_rows, mask=g[:, None] < GROUP, other=0.0)
        begin = split * span
        end = tl.minimum(n, begin + span)
        m, total, acc = attend_span(
            q,
            k_ptr,
            v_ptr,
            table_ptr + b * stride_tb,
            kvh,
            begin,
            end,
            scale,
            stride_ks,
            stride_kh,
            GROUP_PAD,
            D,
            PAGE,
            BLOCK,
        )
        out_rows = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
        if used == 1:
            out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
            tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=g[:, None] < GROUP)
        else:  # partials (m, total, acc) per split; the row's last split to finish merges them
            row = b * KV_HEADS + kvh
            parts = part_ptr + (row * SPLITS * GROUP_PAD + g) * (D + 2)  # split s: + s * GROUP_PAD * (D + 2)
            mine = parts + split * GROUP_PAD * (D + 2)
            tl.store(mine, m)
            tl.store(mine + 1, total)
            tl.store(mine[:, None] + 2 + d[None, :], acc)
            tl.debug_barrier()  # every thread's partials are written before the release below
            if tl.atomic_add(sem_ptr + row, 1, sem="acq_rel", scope="gpu") == used - 1:
                out = merge_splits(parts, used, GROUP_PAD, D, SPLITS)
                tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=g[:, None] < GROUP)
                tl.store(sem_ptr + row, 0)
