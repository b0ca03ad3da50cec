"""An embedding lookup and a running sum in one kernel: ``(table[ids], total + table[ids])``, the code
predictor's per-group step (the drawn code's embedding is the next pass's input and joins the frame's
summed codec embeddings). Replaces an index-select and an add (two PyTorch kernels launched without PDL)
by one PDL kernel; the sum rounded to the dtype as the PyTorch add rounds it (bitwise the reference)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl


@triton.jit
def embed_add_kernel(
    table_ptr, ids_ptr, total_ptr, emb_ptr, sum_ptr, dim, stride_t, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < dim
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    e = tl.load(table_ptr + tl.load(ids_ptr + row) * stride_t + cols, mask=ok, other=0.0)
    tl.store(emb_ptr + row * dim + cols, e, mask=ok)
    t = tl.load(total_ptr + row * dim + cols, mask=ok, other=0.0)
    tl.store(sum_ptr + row * dim + cols, (t.to(tl.float32) + e.to(tl.float32)).to(e.dtype), mask=ok)


def embed_add_triton(table: torch.Tensor, ids: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As the talker's ``embed_add_reference``: table [V, H], ids [B], total [B, H] -> (table[ids],
    total + table[ids]), one kernel (a program per row)."""
    if table.stride(-1) != 1 or total.dtype != table.dtype:
        raise ValueError("embed_add wants a table with contiguous rows and a total in its dtype")
    dim = table.shape[1]
    total = total.reshape(-1, dim).contiguous()
    embedding, summed = torch.empty_like(total), torch.empty_like(total)
    if ids.numel():
        embed_add_kernel[(ids.numel(),)](
            table,
            ids.contiguous(),
            total,
            embedding,
            summed,
            dim,
            table.stride(0),
            BLOCK=1 << (dim - 1).bit_length(),
            **pdl.launch(table.device),
        )
    return embedding, summed
