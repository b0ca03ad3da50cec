"""``silu(gate) * up`` of a merged gate/up projection's output [N, 2I] -> [N, I], rounded like the
PyTorch expression (``layers/moe.silu_mul_reference``: silu rounded to the dtype, then the product):
one kernel instead of three."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl


@triton.jit
def silu_mul_kernel(x_ptr, out_ptr, stride_x, INTER: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTER
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=ok, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * INTER + cols, (silu * up).to(dtype), mask=ok)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> silu(gate) * up [..., I], a program per (row, block of I)."""
    assert gate_up.shape[-1] % 2 == 0, "silu_mul: a merged gate/up output [..., 2I]"
    inter = gate_up.shape[-1] // 2
    flat = gate_up.reshape(-1, 2 * inter)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = flat.new_empty(flat.shape[0], inter)
    block = min(1024, 1 << (inter - 1).bit_length())
    if flat.shape[0]:
        silu_mul_kernel[(flat.shape[0], -(-inter // block))](
            flat, out, flat.stride(0), INTER=inter, BLOCK=block, **pdl.launch(flat.device)
        )
    return out.view(*gate_up.shape[:-1], inter)
