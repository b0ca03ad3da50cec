"""Triton code of the FP8 grouped GEMM and its activation quantiser; ``grouped_fp8`` launches them
(and says what they compute). Imported on first use only: it needs triton.
"""

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # (fp8.FP8_MAX)


@triton.jit
def _quantize(x):
    """fp32 tile [R, G] -> (values to store as e4m3, clamped; scale_inv [R]): each row's largest magnitude
    to 448, as ``fp8.quantize`` computes a block's (an all-zero row keeps scale 1)."""
    amax = tl.max(tl.abs(x), 1)
    # 448 / amax as torch computes a number over a tensor: the reciprocal (rounded once: ``div_rn``, where
    # ``/`` is the GPU's approximate division), then the product
    one = tl.full(amax.shape, 1.0, tl.float32)
    scale = tl.where(amax > 0, tl.math.div_rn(one, tl.where(amax > 0, amax, 1.0)) * FP8_MAX, 1.0)
    return tl.clamp(x * scale[:, None], -FP8_MAX, FP8_MAX), tl.math.div_rn(one, scale)


@triton.jit
def quantize_rows(
    x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, GROUP_PAD: tl.constexpr,
):  # fmt: skip
    """Row ``program_id`` of x, each GROUP columns with their own scale -> e4m3 row and scales."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.arange(0, GROUPS)
    inner = tl.arange(0, GROUP_PAD)
    cols = groups[:, None] * GROUP + inner[None, :]
    ok = (inner < GROUP)[None, :] & (cols < K)
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    q, scale_inv = _quantize(x)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_s + groups, scale_inv, mask=groups * GROUP < K)


@triton.jit
def grouped(
    a_ptr, a_s_ptr, tokens_ptr, w_ptr, s_ptr, ends_ptr, out_ptr, out_s_ptr, N, K,
    stride_am, stride_asm, stride_we, stride_wn, stride_se, stride_sh, stride_sn, stride_om, stride_osm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
    SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """Program (expert, block of BLOCK_N output columns) over that expert's rows, BLOCK_M at a time.
    Rows are e4m3 with a scale per BLOCK_K columns (``a_s``); gated, row i is token ``tokens[i]``'s."""
    expert, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start = tl.load(ends_ptr + tl.maximum(expert - 1, 0)) * (expert > 0)
    end = tl.load(ends_ptr + expert)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    gate_rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn  # (GATED: up rows start N further)
    gate_scales = s_ptr + expert * stride_se + (cols // SCALE_N) * stride_sn  # (up: + stride_sh)
    for m0 in range(start, end, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        m_ok = ms < end
        rows = tl.load(tokens_ptr + ms, mask=m_ok, other=0).to(tl.int64) if GATED else ms.to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            a_s = tl.load(a_s_ptr + rows * stride_asm + k0 // BLOCK_K, mask=m_ok, other=0.0)
            ok = col_ok[:, None] & k_ok[None, :]
            w = tl.load(gate_rows + ks[None, :], mask=ok, other=0.0)
            s = tl.load(gate_scales + k0 // SCALE_K, mask=col_ok, other=0.0)
            acc += tl.dot(a, tl.trans(w)) * (a_s[:, None] * s[None, :])
            if GATED:
                w_up = tl.load(gate_rows + N * stride_wn + ks[None, :], mask=ok, other=0.0)
                s_up = tl.load(gate_scales + stride_sh + k0 // SCALE_K, mask=col_ok, other=0.0)
                acc_up += tl.dot(a, tl.trans(w_up)) * (a_s[:, None] * s_up[None, :])
        out_ok = m_ok[:, None] & col_ok[None, :]
        if GATED:  # silu(gate) * up rounded as ``expert_gate_up`` rounds it, then quantised for the down GEMM
            gate = acc.to(ROUND).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(ROUND).to(tl.float32)
            act = (silu * acc_up.to(ROUND).to(tl.float32)).to(ROUND).to(tl.float32)
            q, scale_inv = _quantize(tl.where(out_ok, act, 0.0))
            tl.store(out_ptr + ms[:, None] * stride_om + cols[None, :], q.to(out_ptr.dtype.element_ty), mask=out_ok)
            tl.store(out_s_ptr + ms * stride_osm + block, scale_inv, mask=m_ok)
        else:
            tl.store(out_ptr + ms[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_ok)
