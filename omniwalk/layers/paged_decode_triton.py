"""Triton code of the paged decode attention kernel; ``paged_decode`` launches it (and says what it
computes). Imported on first use only: it needs triton.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def attend_span(
    q, k_ptr, v_ptr, pages, kvh, begin, end, scale, stride_ks, stride_kh,
    GROUP_PAD: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
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
def paged_decode(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, part_ptr, sem_ptr,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_tb, stride_ob, stride_oh,
    scale,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
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
            q, k_ptr, v_ptr, table_ptr + b * stride_tb, kvh, begin, end, scale, stride_ks, stride_kh,
            GROUP_PAD, D, PAGE, BLOCK,
        )  # fmt: skip
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
