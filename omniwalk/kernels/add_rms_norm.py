"""RMSNorm with the residual add before it, in one kernel: ``(h + delta, RMSNorm(h + delta))``, the
fused form of ``layers/norm.py``'s ``RMSNorm.add`` (which says what ``delta`` may be: None, [N, H] in
h's dtype, or [N, K, H] parts summed before the add) with its rounding steps: fp32 statistics, the
normalised row cast to the input dtype, the weight product rounded to it. A program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl


@triton.jit
def add_rms_norm_kernel(
    h_ptr,
    d_ptr,
    w_ptr,
    h_out_ptr,
    out_ptr,
    dim,
    eps,
    stride_dn,
    stride_dk,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # (a weight: read before the PDL wait)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(h_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    if PARTS > 0:  # the residual add: parts summed in fp32, rounded like the sub-block's output
        acc = tl.zeros((BLOCK,), tl.float32)
        for k in tl.static_range(PARTS):
            acc += tl.load(d_ptr + row * stride_dn + k * stride_dk + cols, mask=mask, other=0.0).to(tl.float32)
            if ROUND_EACH:  # (parts in the dtype: each sum rounded, in order)
                acc = acc.to(dtype).to(tl.float32)
        x = (x + acc.to(dtype).to(tl.float32)).to(dtype)
        tl.store(h_out_ptr + row * dim + cols, x, mask=mask)
        x = x.to(tl.float32)
    y = (x * tl.math.rsqrt(tl.sum(x * x, 0) / dim + eps)).to(dtype)
    tl.store(out_ptr + row * dim + cols, (w.to(tl.float32) * y.to(tl.float32)).to(dtype), mask=mask)


def add_rms_norm_triton(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (h + delta, RMSNorm of it) in h's shape (h itself when ``delta`` is None)."""
    if weight.dtype != h.dtype:
        raise TypeError(f"triton RMSNorm wants the weight in the input's dtype ({weight.dtype} vs {h.dtype})")
    assert weight.shape == (h.shape[-1],), "add_rms_norm: a weight of the hidden size"
    dim = h.shape[-1]
    flat = h.reshape(-1, dim).contiguous()
    out = torch.empty_like(flat)
    h_out, parts = flat, 0
    if delta is not None:
        d = delta.reshape(flat.shape[0], -1, dim)
        if d.stride(-1) != 1:
            d = d.contiguous()
        h_out, parts = torch.empty_like(flat), d.shape[1]
    else:
        d = flat
    if flat.shape[0]:
        add_rms_norm_kernel[(flat.shape[0],)](
            flat,
            d,
            weight,
            h_out,
            out,
            dim,
            eps,
            d.stride(0),
            d.stride(1) if d.dim() == 3 else 0,
            PARTS=parts,
            ROUND_EACH=d.dtype == h.dtype,
            BLOCK=1 << (dim - 1).bit_length(),
            **pdl.launch(h.device),
        )
    return (h if delta is None else h_out.view(h.shape)), out.view(h.shape)
