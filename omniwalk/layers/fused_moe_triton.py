"""Triton code of the expert GEMV kernels; ``fused_moe`` launches them (and says what they compute).
Imported on first use only: it needs triton.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def routed_expert(ids_ptr, pair, USE_PDL: tl.constexpr):
    """The pair's expert id (int64), read after the PDL wait."""
    if USE_PDL:  # (the weights to read depend on the routing ids: nothing to load before the wait)
        gdc_wait()
        gdc_launch_dependents()
    return tl.load(ids_ptr + pair).to(tl.int64)


@triton.jit
def sub_block_steps(BLOCK: tl.constexpr, SUB: tl.constexpr):
    """Offsets of a step of BLOCK columns as [1, BLOCK / SUB, SUB] sub-blocks, each inside one scale column."""
    return tl.arange(0, BLOCK // SUB)[None, :, None] * SUB + tl.arange(0, SUB)[None, None, :]


@triton.jit
def sub_block_scales(
    scales, start, row_ok, K: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr, SCALE_K: tl.constexpr
):
    """[rows, BLOCK / SUB] scale_inv of the step at column ``start``'s sub-blocks (FP8): ``scales``
    points at each row's scale row, a scale column spans SCALE_K of the K columns."""
    sub = (start + tl.arange(0, BLOCK // SUB) * SUB)[None, :]
    return tl.load(scales + sub // SCALE_K, mask=row_ok[:, None] & (sub < K), other=0.0)


@triton.jit
def expert_gate_up(
    x_ptr, w_ptr, s_ptr, ids_ptr, act_ptr, stride_we, stride_wr, stride_se, stride_sh, stride_sr,
    H: tl.constexpr, INTER: tl.constexpr, P: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
    SCALED: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, SUB_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    expert = routed_expert(ids_ptr, pair, USE_PDL)
    token = pair // P
    rows = block * BLOCK_I + tl.arange(0, BLOCK_I)
    row_ok = rows < INTER
    gate_rows = (w_ptr + expert * stride_we + rows[:, None] * stride_wr)[:, :, None]
    up_rows = gate_rows + INTER * stride_wr
    # SCALED (FP8): gate (up) weight (r, h) has scale_inv s[expert, 0 (1), r // SCALE_N, h // SCALE_K]
    gate_scales = s_ptr + expert * stride_se + (rows // SCALE_N)[:, None] * stride_sr
    up_scales = gate_scales + stride_sh
    steps = sub_block_steps(BLOCK_H, SUB_H)
    acc_gate = tl.zeros((BLOCK_I,), tl.float32)
    acc_up = tl.zeros((BLOCK_I,), tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + steps
        col_ok = cols < H
        x = tl.load(x_ptr + token * H + cols, mask=col_ok, other=0.0).to(tl.float32)
        ok = row_ok[:, None, None] & col_ok
        gate = tl.sum(tl.load(gate_rows + cols, mask=ok, other=0.0).to(tl.float32) * x, 2)  # [BLOCK_I, sub-blocks]
        up = tl.sum(tl.load(up_rows + cols, mask=ok, other=0.0).to(tl.float32) * x, 2)
        if SCALED:
            gate *= sub_block_scales(gate_scales, start, row_ok, H, BLOCK_H, SUB_H, SCALE_K)
            up *= sub_block_scales(up_scales, start, row_ok, H, BLOCK_H, SUB_H, SCALE_K)
        acc_gate += tl.sum(gate, 1)
        acc_up += tl.sum(up, 1)
    dtype = act_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    act = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
    tl.store(act_ptr + pair * INTER + rows, act, mask=row_ok)


@triton.jit
def expert_down(
    act_ptr, w_ptr, s_ptr, ids_ptr, weights_ptr, out_ptr, stride_we, stride_wr, stride_se, stride_sr,
    H: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr,
    SCALED: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, SUB_I: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    pair, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    expert = routed_expert(ids_ptr, pair, USE_PDL)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    rows = (w_ptr + expert * stride_we + cols[:, None] * stride_wr)[:, :, None]
    scales = s_ptr + expert * stride_se + (cols // SCALE_N)[:, None] * stride_sr  # (SCALED, as in gate_up)
    steps = sub_block_steps(BLOCK_I, SUB_I)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, INTER, BLOCK_I):
        units = start + steps
        unit_ok = units < INTER
        act = tl.load(act_ptr + pair * INTER + units, mask=unit_ok, other=0.0).to(tl.float32)
        w = tl.load(rows + units, mask=col_ok[:, None, None] & unit_ok, other=0.0)
        part = tl.sum(w.to(tl.float32) * act, 2)  # [BLOCK_N, sub-blocks]
        if SCALED:
            part *= sub_block_scales(scales, start, col_ok, INTER, BLOCK_I, SUB_I, SCALE_K)
        acc += tl.sum(part, 1)
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + pair * H + cols, (acc.to(dtype).to(tl.float32) * weight).to(dtype), mask=col_ok)
