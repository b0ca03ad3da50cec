"""The skinny GEMM's Triton device code (``skinny_gemm.py`` launches it and says what it computes): the GEMV
lanes (one row: ``gemv``), the ``tl.dot`` tiles (padded rows: ``dot_tiles``), the folded norm's prologue
(``row_rstd``, ``normed``), the split-K residual parts (``residual``), FP8 weights' loads and scales, and the
epilogues (``store_output``)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels.fp8 import widen


@triton.jit
def load_weights(ptrs, ok, SCALED: tl.constexpr, WIDEN_ASM: tl.constexpr):
    """A weight tile; FP8 widened to fp32 as loaded (``fp8.widen``), bf16 as stored."""
    w = tl.load(ptrs, mask=ok, other=0.0)
    if SCALED:
        w = widen(w) if WIDEN_ASM else w.to(tl.float32)
    return w


@triton.jit
def scale_pointers(
    s_ptr,
    block,
    cols,
    col_ok,
    stride_sn,
    up_scale_offset,
    BLOCK_N: tl.constexpr,
    SCALE_N: tl.constexpr,
    ROWS_SHARE_SCALE: tl.constexpr,
):
    """FP8 weights: scale_inv of weight (n, k) is at s_ptr + (n // SCALE_N) * stride_sn + k // SCALE_K.
    -> (gate scale rows, up scale rows, their mask), each [1 or BLOCK_N, 1]."""
    if ROWS_SHARE_SCALE:  # (every row of the block in one scale row: one scale row broadcast over them)
        scale_rows = tl.zeros((1, 1), tl.int64) + block * BLOCK_N // SCALE_N
        scale_ok = scale_rows >= 0
    else:
        scale_rows = (cols // SCALE_N).to(tl.int64)[:, None]
        scale_ok = col_ok[:, None]
    gate_scales = s_ptr + scale_rows * stride_sn
    return gate_scales, gate_scales + up_scale_offset, scale_ok


@triton.jit
def residual(h_ptr, d_ptr, ks, ok, stride_dk, PARTS: tl.constexpr, ROUND_EACH: tl.constexpr):
    """h + delta at columns ks, rounded as ``add_rms_norm`` rounds it (delta: PARTS parts summed in
    fp32, each sum rounded when ROUND_EACH, the total rounded before the add); fp32 values of h's dtype."""
    dtype = h_ptr.dtype.element_ty
    x = tl.load(h_ptr + ks, mask=ok, other=0.0).to(tl.float32)
    if PARTS > 0:
        acc = tl.zeros_like(x)
        for k in tl.static_range(PARTS):
            acc += tl.load(d_ptr + k * stride_dk + ks, mask=ok, other=0.0).to(tl.float32)
            if ROUND_EACH:
                acc = acc.to(dtype).to(tl.float32)
        x = (x + acc.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    return x


@triton.jit
def row_rstd(
    h_ptr,
    d_ptr,
    h_out_ptr,
    K,
    eps,
    stride_dk,
    writes_residual,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
):
    """The folded norm's prologue, over the whole row (K_ROW: K padded to a power of two, as the norm
    kernel's block): 1 / rms of h + delta, as ``add_rms_norm`` computes it; the program with
    ``writes_residual`` stores h + delta (the decoder's next residual stream)."""
    cols = tl.arange(0, K_ROW)
    ok = cols < K
    x = residual(h_ptr, d_ptr, cols, ok, stride_dk, PARTS, ROUND_EACH)
    if PARTS > 0:
        tl.store(h_out_ptr + cols, x.to(h_ptr.dtype.element_ty), mask=ok & writes_residual)
    return tl.math.rsqrt(tl.sum(x * x, 0) / K + eps)


@triton.jit
def normed(h_ptr, d_ptr, nw_ptr, ks, ok, rstd, stride_dk, PARTS: tl.constexpr, ROUND_EACH: tl.constexpr):
    """RMSNorm(h + delta) at columns ks with the row's ``rstd``: ``add_rms_norm``'s rounding steps
    (normalised value rounded to the dtype, then the weight product); fp32 values of the dtype."""
    dtype = h_ptr.dtype.element_ty
    y = (residual(h_ptr, d_ptr, ks, ok, stride_dk, PARTS, ROUND_EACH) * rstd).to(dtype).to(tl.float32)
    return (tl.load(nw_ptr + ks, mask=ok, other=0.0).to(tl.float32) * y).to(dtype).to(tl.float32)


@triton.jit
def gemv(
    x_ptr,
    gate_rows,
    up_rows,
    gate_scales,
    up_scales,
    scale_ok,
    col_ok,
    k_start,
    k_end,
    h_ptr,
    d_ptr,
    nw_ptr,
    h_out_ptr,
    K,
    eps,
    stride_dk,
    writes_residual,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_K: tl.constexpr,
    SUB_K: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
    NORM: tl.constexpr,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One row (M = 1): fp32 products summed in lanes, reduced once at the end; K steps cut into
    sub-blocks, each inside one scale column. bf16: a lane per weight of the tile, [BLOCK_N, BLOCK_K / SUB_K,
    SUB_K]; FP8: a lane per V = 16 weights (a thread's 16-byte load), [BLOCK_N, BLOCK_K / SUB_K, SUB_K / 16],
    taking each step's sum of 16 products times the sub-block's scale: a tile of fp32 lanes as large as
    the weight tile spilled FP8 tiles of 128 weights a thread, whose widened weights take a register each
    (sm_90a). Each step's weight tile is loaded one step ahead, the first before
    the PDL wait. x is loaded once per step and broadcast over the tile's rows (for FP8 that layout differs
    from the widened tile's and goes through shared memory, which is faster than loading x in the tile's
    own shape). NORM: x is RMSNorm(h + delta), computed here
    (``row_rstd``, ``normed``). -> (gate or plain sums, up sums), each [BLOCK_N, 1]."""
    V: tl.constexpr = 16 if SCALED else 1
    steps = (
        tl.arange(0, BLOCK_K // SUB_K)[None, :, None, None] * SUB_K
        + tl.arange(0, SUB_K // V)[None, None, :, None] * V
        + tl.arange(0, V)[None, None, None, :]
    )
    gate3, up3 = gate_rows[:, :, None, None], up_rows[:, :, None, None]
    lanes = tl.zeros((BLOCK_N, BLOCK_K // SUB_K, SUB_K // V), tl.float32)
    lanes_up = tl.zeros((BLOCK_N, BLOCK_K // SUB_K, SUB_K // V), tl.float32)
    ks = k_start + steps
    ok = col_ok[:, None, None, None] & (ks < k_end)
    w = load_weights(gate3 + ks, ok, SCALED, WIDEN_ASM)
    w_up = load_weights(up3 + ks, ok, SCALED, WIDEN_ASM) if GATED else w
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = 0.0
    if NORM:
        rstd = row_rstd(h_ptr, d_ptr, h_out_ptr, K, eps, stride_dk, writes_residual, PARTS, ROUND_EACH, K_ROW)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + steps
        if NORM:
            x = normed(h_ptr, d_ptr, nw_ptr, ks, ks < k_end, rstd, stride_dk, PARTS, ROUND_EACH)
        else:
            x = tl.load(x_ptr + ks, mask=ks < k_end, other=0.0).to(tl.float32)
        part = tl.sum(w.to(tl.float32) * x, 3)
        part_up = tl.sum(w_up.to(tl.float32) * x, 3) if GATED else part
        if SCALED:  # (a sub-block's partial sums times its scale: one scale column each)
            sub = (k0 + tl.arange(0, BLOCK_K // SUB_K) * SUB_K)[None, :, None]
            sub_ok = scale_ok[:, :, None] & (sub < k_end)
            if GATED:
                part_up = part_up * tl.load(up_scales[:, :, None] + sub // SCALE_K, mask=sub_ok, other=0.0)
            part = part * tl.load(gate_scales[:, :, None] + sub // SCALE_K, mask=sub_ok, other=0.0)
        lanes += part
        if GATED:
            lanes_up += part_up
        ok = col_ok[:, None, None, None] & (ks + BLOCK_K < k_end)
        w = load_weights(gate3 + BLOCK_K + ks, ok, SCALED, WIDEN_ASM)
        if GATED:
            w_up = load_weights(up3 + BLOCK_K + ks, ok, SCALED, WIDEN_ASM)
    return tl.sum(tl.sum(lanes, 2), 1)[:, None], tl.sum(tl.sum(lanes_up, 2), 1)[:, None]


@triton.jit
def dot_tiles(
    x_ptr,
    gate_rows,
    up_rows,
    gate_scales,
    up_scales,
    scale_ok,
    col_ok,
    rows,
    row_ok,
    k_start,
    k_end,
    stride_xm,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_K: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Several rows: ``tl.dot`` of each weight tile [BLOCK_N, BLOCK_K] with x^T [BLOCK_K, BLOCK_M] (FP8: the
    tile dequantised to x's dtype first, ``fp8.dequantize``'s values: the K step is inside one scale column).
    -> (gate or plain sums, up sums), each [BLOCK_N, BLOCK_M]."""
    if USE_PDL:  # (tl.dot's loads are pipelined by the compiler: no weight tile before the wait)
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + ks[:, None], mask=row_ok[None, :] & k_ok[:, None], other=0.0)
        ok = col_ok[:, None] & k_ok[None, :]
        w = tl.load(gate_rows + ks[None, :], mask=ok, other=0.0)
        w_up = tl.load(up_rows + ks[None, :], mask=ok, other=0.0) if GATED else w
        if not SCALED:
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
            if GATED:
                acc_up = tl.dot(w_up, xt, acc_up, input_precision=PRECISION)
        else:  # (the tile dequantised as ``fp8.dequantize`` does: product in fp32, rounded once to x's dtype)
            s = tl.load(gate_scales + k0 // SCALE_K, mask=scale_ok, other=0.0)
            acc = tl.dot((w.to(tl.float32) * s).to(xt.dtype), xt, acc, input_precision=PRECISION)
            if GATED:
                s_up = tl.load(up_scales + k0 // SCALE_K, mask=scale_ok, other=0.0)
                acc_up = tl.dot((w_up.to(tl.float32) * s_up).to(xt.dtype), xt, acc_up, input_precision=PRECISION)
    return acc, acc_up


@triton.jit
def store_output(acc, acc_up, out, ok, b_ptr, cols, bias_ok, GATED: tl.constexpr, BIAS: tl.constexpr):
    """Round the fp32 sums once to the output's dtype (BIAS: the bias added first where ``bias_ok``, as a
    biased Linear's epilogue adds it); GATED: silu(gate) * up, rounded like ``silu_mul``'s reference (gate
    and up rounded as a GEMM's outputs are, silu rounded, then the product)."""
    dtype = out.dtype.element_ty
    if BIAS:
        acc += tl.load(b_ptr + cols, mask=bias_ok, other=0.0).to(tl.float32)[:, None]
    if GATED:
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = silu * acc_up.to(dtype).to(tl.float32)
    tl.store(out, acc.to(dtype), mask=ok)


@triton.jit(do_not_specialize=["M"])  # (M only masks rows: one compile for every M of a padding)
def skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    k_chunk,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    stride_os,
    up_offset,
    up_scale_offset,
    h_ptr,
    d_ptr,
    nw_ptr,
    h_out_ptr,
    eps,
    stride_dk,
    b_ptr,
    e_ptr,
    e_out_ptr,
    N_E,
    stride_eom,
    stride_eos,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    ROWS_SHARE_SCALE: tl.constexpr,
    SUB_K: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
    NORM: tl.constexpr,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
    EXTRA: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """A program: BLOCK_N weight rows (output columns) x one K range (``split``) x all M rows. EXTRA: the
    programs past W's column blocks take the extra rows (``e_ptr`` [N_E, K]) into their own output."""
    block, split = tl.program_id(0), tl.program_id(1)
    writes_residual = (block == 0) & (split == 0)
    in_w = True
    if EXTRA:
        w_blocks = tl.cdiv(N, BLOCK_N)
        in_w = block < w_blocks
        if block >= w_blocks:
            block -= w_blocks
            w_ptr, out_ptr, N, stride_om, stride_os = e_ptr, e_out_ptr, N_E, stride_eom, stride_eos
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns = weight rows
    col_ok = cols < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k_start = split * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    gate_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + up_offset  # (GATED only: the up half starts I rows further)
    gate_scales, up_scales, scale_ok = scale_pointers(
        s_ptr, block, cols, col_ok, stride_sn, up_scale_offset, BLOCK_N, SCALE_N, ROWS_SHARE_SCALE
    )
    if BLOCK_M == 1:
        acc, acc_up = gemv(
            x_ptr,
            gate_rows,
            up_rows,
            gate_scales,
            up_scales,
            scale_ok,
            col_ok,
            k_start,
            k_end,
            h_ptr,
            d_ptr,
            nw_ptr,
            h_out_ptr,
            K,
            eps,
            stride_dk,
            writes_residual,
            BLOCK_N,
            BLOCK_K,
            GATED,
            SCALED,
            SCALE_K,
            SUB_K,
            WIDEN_ASM,
            NORM,
            PARTS,
            ROUND_EACH,
            K_ROW,
            USE_PDL,
        )
    else:
        acc, acc_up = dot_tiles(
            x_ptr,
            gate_rows,
            up_rows,
            gate_scales,
            up_scales,
            scale_ok,
            col_ok,
            rows,
            row_ok,
            k_start,
            k_end,
            stride_xm,
            BLOCK_N,
            BLOCK_M,
            BLOCK_K,
            GATED,
            SCALED,
            SCALE_K,
            PRECISION,
            USE_PDL,
        )
    out = out_ptr + split * stride_os + rows[None, :] * stride_om + cols[:, None]
    store_output(acc, acc_up, out, col_ok[:, None] & row_ok[None, :], b_ptr, cols, col_ok & in_w, GATED, BIAS)
