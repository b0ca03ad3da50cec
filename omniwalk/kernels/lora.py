"""The batched LoRA delta, Punica-style: shrink ``t = x @ A[slot].T`` (rank wide), then expand
``y += t @ B[slot].T``, each row with its own pool slot (``omniwalk/lora/ops.py`` states the op and its
arithmetic; ``add_lora_reference`` there is the oracle).

Up to ``ROW_KERNEL_MAX_ROWS`` rows (decode), BGMV-like per-row kernels: a program per (row, block of
columns) loads its row's slot, then one tile of that slot's weights (the shrink's A columns, the expand's
B rows) at once, with no loop: a decode step is latency-bound, and the tiled kernels below, whose loops
over slots and ``in`` chain one load latency after another, measured several times slower at these sizes
(``benchmarks/kernels/lora.py``). The shrink writes one fp32 partial per block of ``in``; the expand sums
them (in order: deterministic, no atomics, no zeroed buffer). Where the projection runs through the skinny
GEMM, the shrink needs no kernel of its own: the pool's A rows of every slot ride along as more weight rows
of the projection's GEMV (``SkinnyLinear.with_rows``), and ``expand_lora_triton`` takes each row's slot's
values from that output.

Above, tiled kernels: a program owns a tile of ``BLOCK_M`` consecutive rows and loops over the pool's
slots, skipping every slot none of its rows uses; for a slot it does use, it multiplies its rows of that
slot (the others masked to zero) by the slot's weights with ``tl.dot``. Rows need no sorting: a prefill
chunk packs each request's tokens contiguously and a request has one adapter, so a tile touches one or
two slots (SGMV's work, without the sort and the segment bounds read on the host). The shrink splits
``in`` over programs (fp32 partial sums the expand adds in order), so few row tiles still fill the GPU.

Both read nothing on the host and take their grids from shapes alone, so CUDA graphs capture them with the
slots as an input. Ranks are padded to a power of two >= 16 (``tl.dot``'s minimum) by masked loads of the
pool's zero-padded rank. The kernels launch with PDL (``kernels/pdl.py``).

TODO: tiles as tuned data (``kernels/tuned.py``); the defaults below are generic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl
from omniwalk.lora.ops import check_shapes

TARGET_PROGRAMS = 128  # the shrink's programs to aim for (row tiles x splits of ``in``)
MIN_SPLIT = 256  # the fewest ``in`` columns per split (every expand program sums the splits' partials)
ROW_KERNEL_MAX_ROWS = 64  # up to this many rows (decode), the per-row kernels (one program per row and block)
ROW_TILE = 8192  # the per-row kernels' weight tile (elements: rank x columns), loaded at once


@triton.jit
def lora_shrink_kernel(
    x_ptr, a_ptr, slots_ptr, t_ptr, m, n_in, rank, num_slots, k_per_split,
    stride_xm, stride_as, stride_ar,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """t[split, rows, :R] = x[rows, k-range of split] @ A[slot(row), :, k-range].T (fp32 partial sums)."""
    pid_m, split = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ranks = tl.arange(0, BLOCK_R)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_slot = tl.load(slots_ptr + rows, mask=rows < m, other=-1)
    acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    k_lo = split * k_per_split
    for s in range(num_slots):
        hit = row_slot == s
        if tl.sum(hit.to(tl.int32)) > 0:
            for k in range(k_lo, tl.minimum(k_lo + k_per_split, n_in), BLOCK_K):
                cols = k + tl.arange(0, BLOCK_K)
                x_at = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :]
                xs = tl.load(x_at, mask=hit[:, None] & (cols[None, :] < n_in), other=0.0)
                a_at = a_ptr + s * stride_as + ranks[:, None] * stride_ar + cols[None, :]
                a = tl.load(a_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_in), other=0.0)
                acc = tl.dot(xs, tl.trans(a), acc, input_precision=PRECISION)
    t_at = t_ptr + (split * m + rows.to(tl.int64))[:, None] * BLOCK_R + ranks[None, :]
    tl.store(t_at, acc, mask=rows[:, None] < m)


@triton.jit
def lora_expand_kernel(
    t_ptr, b_ptr, slots_ptr, y_ptr, m, n_out, rank, num_slots, num_splits,
    stride_bs, stride_bn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """y[rows, cols] = y + (sum of t's splits, rounded to B's dtype) @ B[slot(row), cols, :].T, rows of slot >= 0."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, BLOCK_R)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_slot = tl.load(slots_ptr + rows, mask=rows < m, other=-1)
    t = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for split in range(num_splits):
        t_at = t_ptr + (split * m + rows.to(tl.int64))[:, None] * BLOCK_R + ranks[None, :]
        t += tl.load(t_at, mask=rows[:, None] < m, other=0.0)
    t = t.to(b_ptr.dtype.element_ty)
    delta = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in range(num_slots):
        hit = row_slot == s
        if tl.sum(hit.to(tl.int32)) > 0:
            b_at = b_ptr + s * stride_bs + cols[None, :] * stride_bn + ranks[:, None]
            b = tl.load(b_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_out), other=0.0)
            delta = tl.dot(tl.where(hit[:, None], t, 0.0), b, delta, input_precision=PRECISION)
    keep = (row_slot >= 0)[:, None] & (cols[None, :] < n_out)
    y_at = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    y = tl.load(y_at, mask=keep, other=0.0)
    tl.store(y_at, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def lora_shrink_row_kernel(
    x_ptr, a_ptr, slots_ptr, t_ptr, m, n_in, rank, stride_xm, stride_as, stride_ar,
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Per row (BGMV): t[split, row, :R] = x[row, split's BLOCK_K columns] @ A[slot(row), :, those columns].T."""
    row, split = tl.program_id(0), tl.program_id(1)
    ranks = tl.arange(0, BLOCK_R)
    cols = split * BLOCK_K + tl.arange(0, BLOCK_K)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    s = tl.load(slots_ptr + row)
    if s >= 0:
        xs = tl.load(x_ptr + row.to(tl.int64) * stride_xm + cols, mask=cols < n_in, other=0.0).to(tl.float32)
        a_at = a_ptr + s * stride_as + ranks[:, None] * stride_ar + cols[None, :]
        a = tl.load(a_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_in), other=0.0).to(tl.float32)
        tl.store(t_ptr + (split * m + row) * BLOCK_R + ranks, tl.sum(a * xs[None, :], axis=1))


@triton.jit
def lora_expand_row_kernel(
    t_ptr, b_ptr, slots_ptr, y_ptr, n_out, rank, num_splits, stride_ts, stride_tm, stride_tslot,
    stride_bs, stride_bn, stride_ym, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Per row (BGMV): y[row, cols] += (sum of t's splits, rounded to B's dtype) @ B[slot(row), cols, :].T,
    the row's t at ``t_ptr + split * stride_ts + row * stride_tm + slot * stride_tslot`` (its first R values)."""
    row, pid_n = tl.program_id(0), tl.program_id(1)
    ranks = tl.arange(0, BLOCK_R)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    chunk = tl.arange(0, 16)  # partials summed 16 at a time
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    s = tl.load(slots_ptr + row)
    if s >= 0:
        t = tl.zeros((BLOCK_R,), tl.float32)
        t_row = t_ptr + row.to(tl.int64) * stride_tm + s * stride_tslot
        for first in range(0, num_splits, 16):
            t_at = t_row + (first + chunk)[:, None] * stride_ts + ranks[None, :]
            ok = ((first + chunk)[:, None] < num_splits) & (ranks[None, :] < rank)
            t += tl.sum(tl.load(t_at, mask=ok, other=0.0).to(tl.float32), axis=0)
        t = t.to(b_ptr.dtype.element_ty).to(tl.float32)
        b_at = b_ptr + s * stride_bs + cols[:, None] * stride_bn + ranks[None, :]
        b = tl.load(b_at, mask=(ranks[None, :] < rank) & (cols[:, None] < n_out), other=0.0).to(tl.float32)
        y_at = y_ptr + row.to(tl.int64) * stride_ym + cols
        y = tl.load(y_at, mask=cols < n_out, other=0.0)
        delta = tl.sum(b * t[None, :], axis=1)
        tl.store(y_at, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=cols < n_out)


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """As ``add_lora_reference``: x [M, in], y [M, out] (any row stride), a [S, R, in], b [S, out, R], slots [M]."""
    check_shapes(y, x, a, b, slots)
    assert x.dtype == a.dtype == b.dtype, "add_lora: x and the pool's weights in one dtype"
    assert x.stride(1) == y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous(), "add_lora: unit column strides"
    if x.shape[0] == 0:
        return
    slots = slots.to(torch.int32) if slots.dtype != torch.int32 else slots
    if x.shape[0] <= ROW_KERNEL_MAX_ROWS:
        _add_per_row(y, x, a, b, slots)
    else:
        _add_tiled(y, x, a, b, slots)


def _add_per_row(y, x, a, b, slots) -> None:
    (m, n_in), rank = x.shape, a.shape[1]
    block_r = max(16, triton.next_power_of_2(rank))
    block_k = max(32, ROW_TILE // block_r)  # (one load of A's tile per program)
    splits = triton.cdiv(n_in, block_k)
    t = torch.empty(splits, m, block_r, device=x.device, dtype=torch.float32)
    lora_shrink_row_kernel[(m, splits)](
        x, a, slots, t, m, n_in, rank, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_K=block_k, BLOCK_R=block_r, **pdl.launch(x.device),
    )  # fmt: skip
    _expand_per_row(y, t, b, slots, splits, split_stride=m * block_r, row_stride=block_r, slot_stride=0)


def expand_lora_triton(y: torch.Tensor, t: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """The expand alone, after a shrink computed elsewhere for every slot (``SkinnyLinear.with_rows``: the
    pool's A rows in the projection's own GEMV): y[i] += round(t_i[slot]) @ B[slot].T for rows of slot >= 0.
    y [M, out] (any row stride), t [M, S * R] in B's dtype or fp32 split-K partial sums [M, splits, S * R]
    (slot s's values at columns s * R ...), b [S, out, R], slots [M] int32; M <= ``ROW_KERNEL_MAX_ROWS``."""
    m, (num_slots, n_out, rank) = y.shape[0], b.shape
    t3 = t if t.dim() == 3 else t[:, None]
    assert t3.shape == (m, t3.shape[1], num_slots * rank) and slots.shape == (m,) and y.shape[1] == n_out
    assert t3.stride(-1) == y.stride(1) == 1 and b.is_contiguous() and m <= ROW_KERNEL_MAX_ROWS
    if m:
        slots = slots.to(torch.int32) if slots.dtype != torch.int32 else slots
        _expand_per_row(y, t3, b, slots, t3.shape[1], t3.stride(1), t3.stride(0), slot_stride=rank)


def _expand_per_row(y, t, b, slots, splits: int, split_stride: int, row_stride: int, slot_stride: int) -> None:
    """The per-row expand of t's values at ``t + split * split_stride + row * row_stride + slot * slot_stride``."""
    (m, n_out), rank = y.shape, b.shape[2]
    block_r = max(16, triton.next_power_of_2(rank))
    block_n = max(32, ROW_TILE // block_r)  # (one load of B's tile per program)
    lora_expand_row_kernel[(m, triton.cdiv(n_out, block_n))](
        t, b, slots, y, n_out, rank, splits, split_stride, row_stride, slot_stride,
        b.stride(0), b.stride(1), y.stride(0), BLOCK_N=block_n, BLOCK_R=block_r, **pdl.launch(y.device),
    )  # fmt: skip


def _add_tiled(y, x, a, b, slots) -> None:
    (m, n_in), n_out, (num_slots, rank, _) = x.shape, y.shape[1], a.shape
    block_m, block_k, block_n, block_r = 64, 64, 64, max(16, triton.next_power_of_2(rank))
    tiles = triton.cdiv(m, block_m)
    splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(n_in, MIN_SPLIT)))
    k_per_split = triton.cdiv(triton.cdiv(n_in, splits), block_k) * block_k
    splits = triton.cdiv(n_in, k_per_split)  # (every split non-empty)
    t = torch.empty(splits, m, block_r, device=x.device, dtype=torch.float32)
    launch = dict(PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **pdl.launch(x.device))
    lora_shrink_kernel[(tiles, splits)](
        x, a, slots, t, m, n_in, rank, num_slots, k_per_split, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_R=block_r, **launch,
    )  # fmt: skip
    lora_expand_kernel[(tiles, triton.cdiv(n_out, block_n))](
        t, b, slots, y, m, n_out, rank, num_slots, splits, b.stride(0), b.stride(1), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r, **launch,
    )  # fmt: skip
