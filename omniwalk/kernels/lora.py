"""The batched LoRA delta, Punica-style: shrink ``t = x @ A[slot].T`` (rank wide), then expand
``y += t @ B[slot].T``, each row with its own pool slot (``omniwalk/lora/ops.py`` states the op and its
arithmetic; ``add_lora_reference`` there is the oracle).

Design: a program owns a tile of ``BLOCK_M`` consecutive rows and loops over the pool's slots, skipping
every slot none of its rows uses; for a slot it does use, it multiplies its rows of that slot (the others
masked to zero) by the slot's weights with ``tl.dot``. Rows need no sorting: a prefill chunk packs each
request's tokens contiguously and a request has one adapter, so a tile of a prefill touches one or two
slots (SGMV's work, without the sort and the segment bounds read on the host); a decode tile of 16 rows
touches at most min(16, slots) adapters and reads each one's weights once (a per-row gather, BGMV, reads
an adapter's weights once per row: more traffic once rows share adapters). The slots loop is a device
branch: nothing is read on the host and the grid comes from shapes alone, so CUDA graphs capture both
kernels with the slots as an input.

Prefill-sized inputs run two kernels. The shrink splits the ``in`` dimension over programs (fp32
partial sums, summed in order by the expand: deterministic, no atomics, no zeroed buffer), so few row
tiles still fill the GPU. Up to ``FUSED_MAX_ROWS`` rows (decode) the expand shrinks its own rows: one
launch instead of two (a decode step is launch-bound: a layer adds a few of these small kernels per
projection it adapts); each column block re-reads the slot's A, from L2. Ranks are padded to a power of
two >= 16 (``tl.dot``'s minimum) by masked loads of the pool's zero-padded rank. The kernels launch
with PDL (``kernels/pdl.py``).

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
FUSED_MAX_ROWS = 64  # up to this many rows (decode), one kernel: the expand's programs shrink their rows


@triton.jit
def _shrink_rows(
    acc, x_ptr, a_ptr, rows, hit, s, k_lo, k_hi, n_in, rank, stride_xm, stride_as, stride_ar,
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """acc [BLOCK_M, BLOCK_R] + x[rows hit, k_lo:k_hi] @ A[s, :, k_lo:k_hi].T (rows not hit add zeros)."""
    ranks = tl.arange(0, BLOCK_R)
    for k in range(k_lo, k_hi, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        x_at = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :]
        xs = tl.load(x_at, mask=hit[:, None] & (cols[None, :] < n_in), other=0.0)
        a_at = a_ptr + s * stride_as + ranks[:, None] * stride_ar + cols[None, :]
        a = tl.load(a_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_in), other=0.0)
        acc = tl.dot(xs, tl.trans(a), acc, input_precision=PRECISION)
    return acc


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
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_slot = tl.load(slots_ptr + rows, mask=rows < m, other=-1)
    acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, n_in)
    for s in range(num_slots):
        hit = row_slot == s
        if tl.sum(hit.to(tl.int32)) > 0:
            acc = _shrink_rows(
                acc, x_ptr, a_ptr, rows, hit, s, k_lo, k_hi, n_in, rank, stride_xm, stride_as, stride_ar,
                BLOCK_K, BLOCK_R, PRECISION,
            )  # fmt: skip
    t_at = t_ptr + (split * m + rows.to(tl.int64))[:, None] * BLOCK_R + tl.arange(0, BLOCK_R)[None, :]
    tl.store(t_at, acc, mask=rows[:, None] < m)


@triton.jit
def lora_expand_kernel(
    t_ptr, x_ptr, a_ptr, b_ptr, slots_ptr, y_ptr, m, n_in, n_out, rank, num_slots, num_splits,
    stride_xm, stride_as, stride_ar, stride_bs, stride_bn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    SHRINK: tl.constexpr, PRECISION: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """y[rows, cols] = y + t (rounded to B's dtype) @ B[slot(row), cols, :].T for rows of slot >= 0, where t is
    the sum of the shrink's splits, or (``SHRINK``: one kernel for few rows) the shrink computed here."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, BLOCK_R)
    dtype = b_ptr.dtype.element_ty
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    row_slot = tl.load(slots_ptr + rows, mask=rows < m, other=-1)
    t = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    if not SHRINK:
        for split in range(num_splits):
            t_at = t_ptr + (split * m + rows.to(tl.int64))[:, None] * BLOCK_R + ranks[None, :]
            t += tl.load(t_at, mask=rows[:, None] < m, other=0.0)
    delta = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in range(num_slots):
        hit = row_slot == s
        if tl.sum(hit.to(tl.int32)) > 0:
            if SHRINK:
                ts = _shrink_rows(
                    tl.zeros((BLOCK_M, BLOCK_R), tl.float32), x_ptr, a_ptr, rows, hit, s, 0, n_in, n_in, rank,
                    stride_xm, stride_as, stride_ar, BLOCK_K, BLOCK_R, PRECISION,
                ).to(dtype)  # fmt: skip
            else:
                ts = tl.where(hit[:, None], t, 0.0).to(dtype)
            b_at = b_ptr + s * stride_bs + cols[None, :] * stride_bn + ranks[:, None]
            b = tl.load(b_at, mask=(ranks[:, None] < rank) & (cols[None, :] < n_out), other=0.0)
            delta = tl.dot(ts, b, delta, input_precision=PRECISION)
    keep = (row_slot >= 0)[:, None] & (cols[None, :] < n_out)
    y_at = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    y = tl.load(y_at, mask=keep, other=0.0)
    tl.store(y_at, (y.to(tl.float32) + delta).to(y_ptr.dtype.element_ty), mask=keep)


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """As ``add_lora_reference``: x [M, in], y [M, out] (any row stride), a [S, R, in], b [S, out, R], slots [M]."""
    check_shapes(y, x, a, b, slots)
    assert x.dtype == a.dtype == b.dtype, "add_lora: x and the pool's weights in one dtype"
    assert x.stride(1) == y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous(), "add_lora: unit column strides"
    (m, n_in), n_out = x.shape, y.shape[1]
    if m == 0:
        return
    num_slots, rank, _ = a.shape
    block_m, block_k, block_r = 16 if m <= 64 else 64, 64, max(16, triton.next_power_of_2(rank))
    tiles = triton.cdiv(m, block_m)
    launch = dict(PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **pdl.launch(x.device))
    slots = slots.to(torch.int32) if slots.dtype != torch.int32 else slots
    strides = (x.stride(0), a.stride(0), a.stride(1))
    fused = m <= FUSED_MAX_ROWS
    if fused:  # one kernel: each program shrinks its rows itself (A re-read from L2 by each column block)
        t, splits, block_n = x, 1, min(256, max(64, triton.next_power_of_2(triton.cdiv(n_out, TARGET_PROGRAMS))))
    else:
        splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(n_in, MIN_SPLIT)))
        k_per_split = triton.cdiv(triton.cdiv(n_in, splits), block_k) * block_k
        splits, block_n = triton.cdiv(n_in, k_per_split), 64  # (every split non-empty)
        t = torch.empty(splits, m, block_r, device=x.device, dtype=torch.float32)
        lora_shrink_kernel[(tiles, splits)](
            x, a, slots, t, m, n_in, rank, num_slots, k_per_split, *strides,
            BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_R=block_r, **launch,
        )  # fmt: skip
    lora_expand_kernel[(tiles, triton.cdiv(n_out, block_n))](
        t, x, a, b, slots, y, m, n_in, n_out, rank, num_slots, splits, *strides, b.stride(0), b.stride(1), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_R=block_r, SHRINK=fused, **launch,
    )  # fmt: skip
