"""The attention input of a decoder layer from its merged q/k/v projection, in one step:

    qkv [n, (heads + 2 kv_heads) * d]  ->  q = rope(q_norm(q)),  k = rope(k_norm(k)),  v

or, for attention without q/k norm (``q_weight`` and ``k_weight`` None: Qwen2-style, whose biases
the merged projection already added), q = rope(q), k = rope(k).

(per-head RMSNorm before the rotary, ``rotary.apply_rotary``'s rotate-half layout with
``rotary_tables``' cos/sin: [n or 1, 1, d] in the activations' dtype, sin's first half negated).

With ``kv_out = (keys, values, slots)`` k and v are written straight into a KV store instead of
being returned: token i's rows go to ``keys[slots[i]]`` / ``values[slots[i]]`` (keys [slots,
kv_heads, d], e.g. a layer's paged storage), so a decode step needs no separate copy.

``layers/decoder.qk_norm_rope_reference`` is the PyTorch composition (the oracle); ``qk_norm_rope_triton``
is one kernel over (token, head) programs with the reference's rounding steps (norm as ``RMSNorm``; each
rotary product and their sum rounded to the activations' dtype), so on the GPU it is bitwise.
It compiles without floating-point contraction (``enable_fp_fusion=False``): with it, LLVM narrows
the bf16 round trips to bf16 arithmetic and fuses ``x * cos`` into the add (``fma.rn.bf16``, sm_90
PTX), skipping that product's rounding, so q/k elements land a bf16 step off the reference
(``tests/kernels/test_kernel_ptx.py`` checks the PTX).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl

KVOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # keys, values [slots, kv_heads, d], slots [n]
COMPILE_OPTIONS = {"enable_fp_fusion": False}  # the kernel's compile options (the module docstring says why)


@triton.jit
def qk_norm_rope_kernel(
    qkv_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    slots_ptr,
    stride_qkv,
    stride_cos,
    stride_kn,
    stride_kh,
    eps,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    D: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    NORM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    n, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    d = tl.arange(0, D)
    partner = (d + D // 2) % D  # rotate_half reads the other half
    src = qkv_ptr + n * stride_qkv + head * D
    dtype = q_ptr.dtype.element_ty
    row = tl.load(slots_ptr + n).to(tl.int64) if HAS_SLOTS else n
    if head < HEADS + KV_HEADS:
        y = tl.load(src + d).to(tl.float32)
        y_partner = tl.load(src + partner).to(tl.float32)
        is_q = head < HEADS
        if NORM:
            w = tl.where(is_q, tl.load(qw_ptr + d), tl.load(kw_ptr + d)).to(tl.float32)
            w_partner = tl.where(is_q, tl.load(qw_ptr + partner), tl.load(kw_ptr + partner)).to(tl.float32)
            r = tl.math.rsqrt(tl.sum(y * y, 0) / D + eps)
            y_partner = (w_partner * (y_partner * r).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
            y = (w * (y * r).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        c = tl.load(cos_ptr + n * stride_cos + d).to(tl.float32)
        s = tl.load(sin_ptr + n * stride_cos + d).to(tl.float32)
        out = ((y * c).to(dtype).to(tl.float32) + (y_partner * s).to(dtype).to(tl.float32)).to(dtype)
        if is_q:
            tl.store(q_ptr + (n * HEADS + head) * D + d, out)
        else:
            tl.store(k_ptr + row * stride_kn + (head - HEADS) * stride_kh + d, out)
    else:
        tl.store(v_ptr + row * stride_kn + (head - HEADS - KV_HEADS) * stride_kh + d, tl.load(src + d))


def qk_norm_rope_triton(qkv, q_weight, k_weight, eps, cos, sin, heads, kv_heads, kv_out: KVOut | None = None):
    """-> (q [n, heads, d], k, v [n, kv_heads, d]; k, v are None when written to ``kv_out``)."""
    assert qkv.shape[-1] == (heads + 2 * kv_heads) * cos.shape[-1], "qk_norm_rope: qkv [n, (heads + 2 kv_heads) d]"
    n, d = qkv.shape[0], cos.shape[-1]
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    q = qkv.new_empty(n, heads, d)
    if kv_out is None:
        k, v = qkv.new_empty(n, kv_heads, d), qkv.new_empty(n, kv_heads, d)
        keys, values, slots = k, v, q  # (slots unused)
    else:
        keys, values, slots = kv_out
        k = v = None
    if keys.stride(-1) != 1 or keys.stride() != values.stride():
        raise ValueError("keys and values must share a layout with contiguous head rows")
    cos_stride = cos.stride(0) if cos.shape[0] > 1 else 0  # one table row broadcast over the tokens
    if n:
        qk_norm_rope_kernel[(n, heads + 2 * kv_heads)](
            qkv,
            qkv if q_weight is None else q_weight,
            qkv if k_weight is None else k_weight,
            cos,
            sin,
            q,
            keys,
            values,
            slots,
            qkv.stride(0),
            cos_stride,
            keys.stride(0),
            keys.stride(1),
            eps,
            HEADS=heads,
            KV_HEADS=kv_heads,
            D=d,
            HAS_SLOTS=kv_out is not None,
            NORM=q_weight is not None,
            **COMPILE_OPTIONS,
            **pdl.launch(qkv.device),
        )
    return q, k, v
