"""RMSNorm as HF computes it (variance in fp32, the weight applied after casting back), and the
residual add that precedes every decoder norm.

``RMSNorm.add(h, delta)`` returns ``(h + delta, norm(h + delta))``: the decoder's residual stream
and the next sub-block's input in one call. ``delta`` is a sub-block's output: None (nothing to
add), [N, H] in h's dtype, or [N, K, H] parts whose sum is the output, rounded to h's dtype before
the add (as the reference rounds a sub-block's output before its residual add):

    fp32 parts      a split-K GEMM's partial sums (``skinny_gemm``): summed in fp32, rounded once
                    (the rounding of the unsplit product)
    parts in h's    the fused MoE's weighted expert outputs, in ascending expert id
    dtype           (``moe_routing``): added in order, each sum rounded to the dtype, as HF's MoE
                    adds them (``index_add_`` into zeros, expert by expert)

Backends (``RMSNorm.backend``, set from config when a model is built): ``reference`` is the
PyTorch expression (eight elementwise kernels, the oracle); ``triton`` is one kernel per call for
the add and the norm together, with the same rounding steps (fp32 statistics, cast to the input
dtype, weight product rounded to it): bitwise equal to the reference on the H200 for a plain norm.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from omniwalk.layers import pdl


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.backend = "reference"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, None)[1]

    def add(self, h: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (h + delta, RMSNorm of it); see the module docstring for ``delta``'s shapes."""
        if self.backend == "triton":
            return add_rms_norm_triton(h, delta, self.weight, self.eps)
        h = residual_add(h, delta)
        dtype = h.dtype
        x32 = h.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return h, self.weight * x32.to(dtype)


def residual_add(h: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
    """h + delta, delta as in ``RMSNorm.add`` (the module docstring: how parts are summed)."""
    if delta is None:
        return h
    if delta.dim() == h.dim():
        return h + delta
    if delta.dtype != h.dtype:
        return h + delta.float().sum(-2).to(h.dtype)
    total = delta[..., 0, :]
    for k in range(1, delta.shape[-2]):
        total = total + delta[..., k, :]
    return h + total


NORM_BACKENDS = ("reference", "triton")


def set_norm_backend(module: nn.Module, backend: str) -> None:
    """Every RMSNorm under ``module`` uses ``backend``."""
    if backend not in NORM_BACKENDS:
        raise ValueError(f"norm backend must be one of {NORM_BACKENDS}, got {backend!r}")
    for m in module.modules():
        if isinstance(m, RMSNorm):
            m.backend = backend


@functools.cache
def _kernel():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def add_rms_norm(
        h_ptr, d_ptr, w_ptr, h_out_ptr, out_ptr, dim, eps, stride_dn, stride_dk,
        PARTS: tl.constexpr, ROUND_EACH: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
    ):  # fmt: skip
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

    return add_rms_norm


def add_rms_norm_triton(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if weight.dtype != h.dtype:
        raise TypeError(f"triton RMSNorm wants the weight in the input's dtype ({weight.dtype} vs {h.dtype})")
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
        _kernel()[(flat.shape[0],)](
            flat, d, weight, h_out, out, dim, eps, d.stride(0), d.stride(1) if d.dim() == 3 else 0,
            PARTS=parts, ROUND_EACH=d.dtype == h.dtype, BLOCK=1 << (dim - 1).bit_length(), **pdl.launch(h.device),
        )  # fmt: skip
    return (h if delta is None else h_out.view(h.shape)), out.view(h.shape)
