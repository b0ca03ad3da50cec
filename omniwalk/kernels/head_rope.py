"""Rotary embedding on the first head of q and k only, inside a merged q/k/v projection's output:

    qkv [M, T, 3 * heads * d] (q heads, k heads, v heads) -> the same with q's and k's head 0
    replaced by ``rotary.apply_rotary`` of it (rotate-half layout, ``rotary_tables``' cos/sin [T, 1, d]
    in qkv's dtype, sin's first half negated)

Qwen2.5-Omni's token2wav DiT rotates head 0 alone (HF ``Qwen2_5_OmniDiTAttention``: ``apply_rotary_pos_emb``
on ``query[:, :1]`` / ``key[:, :1]``), its pairs interleaved; the DiT's merged projection stores head 0's
rows de-interleaved, so the pairs arrive in rotate-half layout (q and k alike: dot products unchanged).

``layers/rotary.head_rope_reference`` is the PyTorch composition (a new tensor); ``head_rope_triton`` writes qkv in
place, one program a frame, rounding each product and the sum to the dtype (no contraction, as
``qk_norm_rope``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniwalk.kernels.qk_norm_rope import COMPILE_OPTIONS


@triton.jit
def head_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, frames, stride_row, stride_cos, INNER: tl.constexpr, D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = row % frames
    cols = tl.arange(0, D)
    turned = (cols + D // 2) % D  # rotate_half's source column (sin's sign is in the table)
    dtype = qkv_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + t * stride_cos + cols).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_cos + cols).to(tl.float32)
    for part in tl.static_range(2):  # q's head 0, then k's
        base = qkv_ptr + row * stride_row + part * INNER
        x = tl.load(base + cols).to(tl.float32)
        y = tl.load(base + turned).to(tl.float32)
        a = (x * cos).to(dtype).to(tl.float32)
        b = (y * sin).to(dtype).to(tl.float32)
        tl.store(base + cols, (a + b).to(dtype))


def head_rope_triton(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """As ``head_rope_reference``, in place on a contiguous ``qkv``; returns it."""
    m, t, width = qkv.shape
    d = width // (3 * heads)
    if not qkv.is_contiguous() or cos.shape[0] != t or cos.shape[-1] != d or cos.dtype != qkv.dtype:
        raise ValueError("head_rope wants a contiguous qkv [M, T, 3 * heads * d] and cos/sin [T, 1, d] in its dtype")
    cos, sin = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
    if qkv.numel():
        head_rope_kernel[(m * t,)](qkv, cos, sin, t, width, d, INNER=heads * d, D=d, **COMPILE_OPTIONS)
    return qkv
