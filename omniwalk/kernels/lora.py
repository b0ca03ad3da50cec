"""The batched LoRA delta, Punica-style: shrink ``t = x @ A[slot].T`` (rank wide), then expand
``y += t @ B[slot].T``, each row with its own pool slot (``omniwalk/lora/ops.py`` states the op and its
arithmetic; ``add_lora_reference`` there is the oracle).

Up to ``ROW_KERNEL_MAX_ROWS`` rows (decode), one BGMV-like per-row kernel does both: a program per (row,
range of columns) loads its row's slot, computes the row's whole shrink itself (A[slot] in tiles along
``in``, fp32 products summed once, rounded to A's dtype), then its columns of the expand. A decode step
is latency-bound: one launch per add instead of a shrink and an expand saves a kernel boundary per
projection, and the tiled kernels below, whose loops over slots chain one load latency after another,
measured several times slower at these sizes (``benchmarks/kernels/lora.py``). The price is that every
program of a row reads A[slot] again (from L2 after the first: rank x ``in``, e.g. 64 KB at rank 16 and
``in`` 2048), so the programs number about ``ROW_PROGRAMS`` in all: many narrow column ranges per row when
the rows are few (short latency), a few wide ones, looped over in tiles, when they are many (bounded A
traffic).

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
ROW_KERNEL_MAX_ROWS = 64  # up to this many rows (decode), the per-row kernel (programs per row and column range)
ROW_PROGRAMS = 128  # the per-row kernel's programs to aim for (rows x column ranges)
ROW_TILE = 16384  # the per-row kernel's weight tile (elements: rank x columns of A or B), loaded at once
ROW_WARPS = 8  # the per-row kernel's warps (a tile is 64 elements a thread)


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
def lora_row_kernel(
    x_ptr, a_ptr, b_ptr, slots_ptr, y_ptr, n_in, n_out, rank, cols_per_program,
    stride_xm, stride_as, stride_ar, stride_bs, stride_bn, stride_ym,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Per row (BGMV), shrink and expand in one program: y[row, its columns] += t @ B[slot(row), those columns].T
    with t = x[row] @ A[slot(row)].T rounded to A's dtype; a row of slot -1 returns at once."""
    row, pid_n = tl.program_id(0), tl.program_id(1)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    s = tl.load(slots_ptr + row).to(tl.int64)
    if s >= 0:
        x_row, y_row = x_ptr + row.to(tl.int64) * stride_xm, y_ptr + row.to(tl.int64) * stride_ym
        t = _row_shrink(x_row, a_ptr + s * stride_as, n_in, rank, stride_ar, BLOCK_K, BLOCK_R)
        col_lo = pid_n * cols_per_program
        col_hi = tl.minimum(col_lo + cols_per_program, n_out)
        _row_expand(t, b_ptr + s * stride_bs, y_row, col_lo, col_hi, rank, stride_bn, BLOCK_N, BLOCK_R)


@triton.jit
def _row_shrink(x_row, a_slot, n_in, rank, stride_ar, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """x_row @ a_slot.T over ``in`` in tiles of BLOCK_K columns, fp32 products summed once at the end, rounded
    to A's dtype (held as fp32 for the expand)."""
    ranks = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    for k in range(0, n_in, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        xs = tl.load(x_row + cols, mask=cols < n_in, other=0.0).to(tl.float32)
        a_at = a_slot + ranks[:, None] * stride_ar + cols[None, :]
        a = tl.load(a_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_in), other=0.0).to(tl.float32)
        acc += a * xs[None, :]
    return tl.sum(acc, axis=1).to(a_slot.dtype.element_ty).to(tl.float32)


@triton.jit
def _row_expand(t, b_slot, y_row, col_lo, col_hi, rank, stride_bn, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """y_row[col_lo:col_hi] += t @ b_slot[col_lo:col_hi].T in tiles of BLOCK_N columns, each added in fp32 and
    rounded once to y's dtype."""
    ranks = tl.arange(0, BLOCK_R)
    for n in range(col_lo, col_hi, BLOCK_N):
        cols = n + tl.arange(0, BLOCK_N)
        b_at = b_slot + cols[:, None] * stride_bn + ranks[None, :]
        b = tl.load(b_at, mask=(ranks[None, :] < rank) & (cols[:, None] < col_hi), other=0.0).to(tl.float32)
        y = tl.load(y_row + cols, mask=cols < col_hi, other=0.0)
        delta = tl.sum(b * t[None, :], axis=1)
        tl.store(y_row + cols, (y.to(tl.float32) + delta).to(y_row.dtype.element_ty), mask=cols < col_hi)


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
    (m, n_in), n_out, rank = x.shape, y.shape[1], a.shape[1]
    block_r = max(16, triton.next_power_of_2(rank))
    tile_columns = max(32, ROW_TILE // block_r)  # (columns of one A or B tile)
    row_columns = triton.cdiv(n_out, triton.cdiv(ROW_PROGRAMS, m))  # (each row's share of the programs)
    block_n = min(max(32, triton.next_power_of_2(row_columns)), tile_columns)
    cols_per_program = triton.cdiv(row_columns, block_n) * block_n
    lora_row_kernel[(m, triton.cdiv(n_out, cols_per_program))](
        x, a, b, slots, y, n_in, n_out, rank, cols_per_program,
        x.stride(0), a.stride(0), a.stride(1), b.stride(0), b.stride(1), y.stride(0),
        BLOCK_K=tile_columns, BLOCK_N=block_n, BLOCK_R=block_r, num_warps=ROW_WARPS, **pdl.launch(x.device),
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
