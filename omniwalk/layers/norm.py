"""RMSNorm as HF computes it: variance in fp32, the weight applied after casting back.

Backends (``RMSNorm.backend``, set from config when a model is built): ``reference`` is the
PyTorch expression below (eight elementwise kernels); ``triton`` is one kernel per call with
the same rounding steps (fp32 statistics, cast to the input dtype, weight product rounded to it;
bitwise equal to the reference on the H200), for CUDA decode steps where launches, not bytes,
set the time.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.backend = "reference"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "triton":
            return rms_norm_triton(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


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

    @triton.jit
    def rms_norm(x_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x * tl.math.rsqrt(tl.sum(x * x, 0) / dim + eps)).to(out_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * dim + cols, out, mask=mask)

    return rms_norm


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if weight.dtype != x.dtype:
        raise TypeError(f"triton RMSNorm wants the weight in the input's dtype ({weight.dtype} vs {x.dtype})")
    dim = x.shape[-1]
    flat = x.reshape(-1, dim).contiguous()
    out = torch.empty_like(flat)
    if flat.shape[0]:
        _kernel()[(flat.shape[0],)](flat, weight, out, dim, eps, BLOCK=1 << (dim - 1).bit_length())
    return out.view(x.shape)
