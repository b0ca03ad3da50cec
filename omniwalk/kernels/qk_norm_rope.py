"""The attention input of a decoder layer from its merged q/k/v projection, in one step:

    qkv [n, (heads + 2 kv_heads) * d]  ->  q = rope(q_norm(q)),  k = rope(k_norm(k)),  v

or, for attention without q/k norm (``q_weight`` and ``k_weight`` None: Qwen2-style, whose biases
the merged projection already added), q = rope(q), k = rope(k).

(per-head RMSNorm before the rotary, ``rotary.apply_rotary``'s rotate-half layout with
``rotary_tables``' cos/sin: [n or 1, 1, d] in the activations' dtype, sin's first half negated).

With ``kv_out = (keys, values, slots)`` k and v are written straight into a KV store instead of
being returned: token i's rows go to ``keys[slots[i]]`` / ``values[slots[i]]`` (keys [slots,
kv_heads, d], e.g. a layer's paged storage), so a decode step needs no separate copy.

With ``lora`` (``layers.linear.LoraExpand``) each row's LoRA delta is added to its q/k/v values first, as
``kernels/lora.expand_lora_triton`` adds it (t: every slot's shrink of the row, from the projection's GEMV;
the sum rounded once to the dtype): the expand after q/k/v costs no launch of its own.

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
from omniwalk.layers.linear import LoraExpand

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
    t_ptr,
    b_ptr,
    lora_slots_ptr,
    stride_t,
    stride_bs,
    stride_bn,
    rank,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    D: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    NORM: tl.constexpr,
    LORA: tl.constexpr,
    BLOCK_R: tl.constexpr,
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
    y = tl.load(src + d).to(tl.float32)
    if LORA:  # (the row's LoRA delta added and rounded once, as the expand kernel adds it; none: an exact 0)
        ranks = tl.arange(0, BLOCK_R)
        lora_slot = tl.load(lora_slots_ptr + n)
        lora_ok = (ranks < rank) & (lora_slot >= 0)
        lora_slot = tl.maximum(lora_slot, 0)
        t = tl.load(t_ptr + n * stride_t + lora_slot * rank + ranks, mask=lora_ok, other=0.0)
        t = t.to(b_ptr.dtype.element_ty).to(tl.float32)
        b_slot = b_ptr + lora_slot.to(tl.int64) * stride_bs + ranks[None, :]
        y = (y + lora_delta(b_slot, head * D + d, stride_bn, t, lora_ok)).to(dtype).to(tl.float32)
    if head < HEADS + KV_HEADS:
        y_partner = tl.load(src + partner).to(tl.float32)
        if LORA:
            y_partner = y_partner + lora_delta(b_slot, head * D + partner, stride_bn, t, lora_ok)
            y_partner = y_partner.to(dtype).to(tl.float32)
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
        tl.store(v_ptr + row * stride_kn + (head - HEADS - KV_HEADS) * stride_kh + d, y.to(dtype))


@triton.jit
def lora_delta(b_slot, cols, stride_bn, t, ok):
    """The LoRA delta of output columns ``cols`` [D]: B[slot, cols, :] @ t (t [BLOCK_R] fp32, ``ok`` its ranks)."""
    b = tl.load(b_slot + cols[:, None].to(tl.int64) * stride_bn, mask=ok[None, :], other=0.0).to(tl.float32)
    return tl.sum(b * t[None, :], axis=1)


def qk_norm_rope_triton(
    qkv, q_weight, k_weight, eps, cos, sin, heads, kv_heads, kv_out: KVOut | None = None, lora: LoraExpand | None = None
):
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
    if lora is not None:
        t, b, lora_slots = lora
        assert t.shape == (n, b.shape[0] * b.shape[2]) and t.stride(1) == 1 and b.is_contiguous(), "lora: t, b"
        assert b.shape[1] == qkv.shape[-1] and lora_slots.shape == (n,) and lora_slots.dtype == torch.int32
    else:
        t = b = lora_slots = qkv  # (not read)
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
            t,
            b,
            lora_slots,
            *((t.stride(0), b.stride(0), b.stride(1), b.shape[2]) if lora is not None else (0, 0, 0, 0)),
            HEADS=heads,
            KV_HEADS=kv_heads,
            D=d,
            HAS_SLOTS=kv_out is not None,
            NORM=q_weight is not None,
            LORA=lora is not None,
            BLOCK_R=max(16, triton.next_power_of_2(b.shape[2])) if lora is not None else 16,
            **COMPILE_OPTIONS,
            **pdl.launch(qkv.device),
        )
    return q, k, v
