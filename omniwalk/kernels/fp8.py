"""FP8 (e4m3) in Triton: the exact e4m3 -> fp32 widening the GEMVs use, and the dequantize kernel.

``widen`` converts a tile through the hardware's paired converts, from the 32-bit registers the
weights were loaded in (Triton's ``pack=4``: 4 weights a word, two paired converts and four
f16 -> f32), so the skinny GEMV's loop carries fp32 instead of repacking bytes for Triton's cast.
Triton's interpreter (the CPU) runs no PTX: kernels call ``widen(w) if WIDEN_ASM else w.to(tl.float32)``
with ``WIDEN_ASM=asm_widening(device)``. The weight format itself is ``layers/fp8.py``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniwalk.layers.fp8 import Block


def asm_widening(device: torch.device) -> bool:
    """Whether kernels on ``device`` widen e4m3 with the inline PTX (CUDA; not Triton's interpreter)."""
    if device.type != "cuda":
        return False
    from triton import knobs

    return not knobs.runtime.interpret


@triton.jit
def widen(w):
    """e4m3 tensor -> fp32 tensor, exactly (see the module docstring)."""
    return tl.inline_asm_elementwise(
        """{ .reg .b16 lo, hi; .reg .b32 a, b; .reg .f16 h0, h1, h2, h3;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 a, lo;
        cvt.rn.f16x2.e4m3x2 b, hi;
        mov.b32 {h0, h1}, a;
        mov.b32 {h2, h3}, b;
        cvt.f32.f16 $0, h0;
        cvt.f32.f16 $1, h1;
        cvt.f32.f16 $2, h2;
        cvt.f32.f16 $3, h3; }""",
        "=r,=r,=r,=r,r",
        [w],
        dtype=tl.float32,
        is_pure=True,
        pack=4,
    )


@triton.jit
def dequantize_kernel(
    q_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    stride_q,
    stride_s,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    w = tl.load(q_ptr + rows.to(tl.int64)[:, None] * stride_q + cols[None, :], mask=ok, other=0.0)
    s = tl.load(s_ptr + (rows // SCALE_N)[:, None] * stride_s + (cols // SCALE_K)[None, :], mask=ok, other=0.0)
    y = w.to(tl.float32) * s
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=ok)


def dequantize_triton(q: torch.Tensor, scale_inv: torch.Tensor, block: Block, dtype: torch.dtype) -> torch.Tensor:
    """``layers/fp8.dequantize`` of a 2-D weight in one kernel (the same values: each product in fp32, rounded
    once to ``dtype``): FP8 read once, ``dtype`` written once. The fast path's prefill-sized products
    multiply this copy."""
    assert q.dim() == 2 and scale_inv.dim() == 2, "dequantize_triton: a 2-D weight and its 2-D scale grid"
    n, k = q.shape
    out = torch.empty(n, k, dtype=dtype, device=q.device)
    if q.numel():
        rows, cols = 32, 128
        dequantize_kernel[(-(-n // rows), -(-k // cols))](
            q,
            scale_inv,
            out,
            n,
            k,
            q.stride(0),
            scale_inv.stride(0),
            SCALE_N=block[0],
            SCALE_K=block[1],
            BLOCK_N=rows,
            BLOCK_K=cols,
        )
    return out
