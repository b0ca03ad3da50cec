"""AdaLN-zero, a DiT block's norm: the previous sub-block's gated residual add, then a LayerNorm
(no affine, eps 1e-6) modulated per row of the batch by vectors computed from the time embedding:

    h' = h + gate * delta                     (skipped when ``delta`` is None)
    out = layer_norm(h') * (1 + scale) + shift

h, delta [M, T, H]; gate, scale, shift [M, H] (one vector per row, broadcast over its T frames;
views of one merged modulation output are fine: they share a row stride). -> (h', out).

``models/qwen2_5_omni/networks/dit.adaln_reference`` is the PyTorch expression (five or six
elementwise kernels, the oracle: the DiT's own order of operations, e.g. HF's
``Qwen2_5_OmniDiTDecoderLayer``); ``adaln_triton`` is one kernel a frame with the reference's
rounding steps (the gated product and the sum rounded to the dtype, the normalised row rounded as
``layer_norm`` returns it, ``1 + scale``, the product and the shift's sum each rounded), compiled
without floating-point contraction (as ``qk_norm_rope``: LLVM would fuse a product into the next add
and skip its rounding). Its statistics are two-pass fp32 where PyTorch's CUDA layer norm uses
Welford: equal to fp32 rounding, not bitwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniwalk.kernels.qk_norm_rope import COMPILE_OPTIONS

EPS = 1e-6  # the DiT's LayerNorm (``dit.adaln_reference``)


@triton.jit
def adaln_kernel(
    h_ptr,
    d_ptr,
    g_ptr,
    scale_ptr,
    shift_ptr,
    h_out_ptr,
    out_ptr,
    frames,
    dim,
    stride_m,
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    m = row // frames  # the batch row whose modulation vectors apply
    cols = tl.arange(0, BLOCK)
    ok = cols < dim
    dtype = out_ptr.dtype.element_ty
    x = tl.load(h_ptr + row * dim + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        g = tl.load(g_ptr + m * stride_m + cols, mask=ok, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + row * dim + cols, mask=ok, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) + (g * d).to(dtype).to(tl.float32)).to(dtype)
        tl.store(h_out_ptr + row * dim + cols, x, mask=ok)
    x = x.to(tl.float32)
    mean = tl.sum(x, 0) / dim
    centred = tl.where(ok, x - mean, 0.0)
    normed = (centred * tl.math.rsqrt(tl.sum(centred * centred, 0) / dim + eps)).to(dtype).to(tl.float32)
    scale = (1.0 + tl.load(scale_ptr + m * stride_m + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype)
    shift = tl.load(shift_ptr + m * stride_m + cols, mask=ok, other=0.0).to(tl.float32)
    product = (normed * scale.to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * dim + cols, (product + shift).to(dtype), mask=ok)


def adaln_triton(
    h: torch.Tensor, delta: torch.Tensor | None, gate: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As the DiT's ``adaln_reference``, one kernel (a program per frame)."""
    vectors = (scale, shift) if delta is None else (gate, scale, shift)
    stride_m = scale.stride(0)
    if any(v.stride() != (stride_m, 1) or v.dtype != h.dtype for v in vectors):
        raise ValueError("adaln wants gate/scale/shift [M, H] in h's dtype, with one row stride and unit columns")
    m, frames, dim = h.shape
    h = h.contiguous()
    out = torch.empty_like(h)
    h_out = h if delta is None else torch.empty_like(h)
    d = h if delta is None else delta.contiguous()
    if h.numel():
        adaln_kernel[(m * frames,)](
            h,
            d,
            scale if gate is None else gate,
            scale,
            shift,
            h_out,
            out,
            frames,
            dim,
            stride_m,
            EPS,
            HAS_DELTA=delta is not None,
            BLOCK=1 << (dim - 1).bit_length(),
            **COMPILE_OPTIONS,
        )
    return h_out, out
