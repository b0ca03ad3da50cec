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

``RMSNorm.add`` is the PyTorch expression (eight elementwise kernels; the oracle) until
``use_fused_kernel`` (the fused decoder kernels, ``decoder_kernels="fused"``) makes it one kernel per
call for the add and the norm together (``kernels/add_rms_norm.py``), with the same rounding steps
(fp32 statistics, cast to the input dtype, weight product rounded to it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel: Callable | None = None  # the fused add + norm (``use_fused_kernel``); None: the expression

    def use_fused_kernel(self) -> None:
        """``add`` becomes one kernel (``kernels/add_rms_norm.py``); called once the weights are loaded."""
        from omniwalk.kernels.add_rms_norm import add_rms_norm_triton

        self.kernel = add_rms_norm_triton

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, None)[1]

    def add(self, h: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (h + delta, RMSNorm of it); see the module docstring for ``delta``'s shapes."""
        if self.kernel is not None:
            return self.kernel(h, delta, self.weight, self.eps)
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
