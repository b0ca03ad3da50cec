"""Decode attention over paged KV: one new query per request, a whole batch in one launch.

    q        [B, heads, d]             the batch's new queries (one token per request)
    keys     [slots, kv_heads, d]      a layer's paged storage (slot = page * page_size + offset)
    table    [B, max_pages] int32      each request's pages, in order (entries past its length unused)
    lens     [B] int32                 keys per request, the new token's included (0 = padding row)
    -> out   [B, heads, d]

Backends: ``reference`` gathers each request's keys and calls the same causal attention as the
contiguous cache (the oracle; reads ``lens`` on the host); ``triton`` is one kernel over
(request, kv head) programs with an online softmax over blocks of pages, reading lengths and
pages on the device: no host synchronisation, fixed shapes, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools

import torch

from omniwalk.layers.kv_attention import causal_attention


def paged_decode_reference(q, keys, values, table, lens, page_size: int) -> torch.Tensor:
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
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(
        q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
        stride_qb, stride_qh, stride_ks, stride_kh, stride_tb, stride_ob, stride_oh,
        scale,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        b, kvh = tl.program_id(0), tl.program_id(1)
        n = tl.load(lens_ptr + b)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D)
        heads = kvh * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=g[:, None] < GROUP, other=0.0)
        m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        total = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, D), tl.float32)
        for start in range(0, n, BLOCK):
            pos = start + tl.arange(0, BLOCK)
            valid = pos < n
            page = tl.load(table_ptr + b * stride_tb + pos // PAGE, mask=valid, other=0)
            slot = (page.to(tl.int64) * PAGE + pos % PAGE) * stride_ks + kvh * stride_kh
            k = tl.load(k_ptr + slot[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            v = tl.load(v_ptr + slot[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g[:, None] < GROUP,
        )

    return paged_decode


def paged_decode_triton(q, keys, values, table, lens, page_size: int) -> torch.Tensor:
    batch, heads, d = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    out = torch.empty_like(q)
    block = max(64, page_size)
    _kernel()[(batch, kv_heads)](
        q, keys, values, table, lens, out,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), table.stride(0), out.stride(0), out.stride(1),
        d**-0.5,
        GROUP=group, GROUP_PAD=max(16, 1 << (group - 1).bit_length()), D=d, PAGE=page_size, BLOCK=block,
    )  # fmt: skip
    return out


DECODE_BACKENDS = {"reference": paged_decode_reference, "triton": paged_decode_triton}
