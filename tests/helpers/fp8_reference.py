"""References for the FP8 grouped GEMM's tests (CPU: ``test_fp8_kernels.py``, GPU: ``test_fp8_gpu.py``):
its math emulated in fp32, and how near the weight-only reference it must stay."""

import torch
import torch.nn.functional as F

from omniwalk.layers.fp8 import dequantize, quantize


def rounded(a: torch.Tensor, group: int) -> torch.Tensor:
    """a [R, C] rounded as the grouped path rounds activations: e4m3 per row and group, back in fp32."""
    return dequantize(*quantize(a, (1, group)), (1, group), torch.float32)


def w8a8_experts(x, gate_up, down, weights, ids, group: int, act_group: int) -> torch.Tensor:
    """The grouped path's math in fp32, an expert at a time: x and silu(gate) * up rounded to e4m3 per row
    and ``group`` / ``act_group`` columns (``quantize(., (1, group))``), times the dequantised weights
    gate_up [E, 2I, H] and down [E, H, I] -> [N, k, H] weighted partials. gate, up, silu(gate) and their
    product are rounded to x's dtype before the e4m3 rounding, as the kernel rounds them (without it the
    emulation was 1.6-2.2% of the output's max off the kernel on the GPU: a bf16 rounding
    moves some activations to the next e4m3 value)."""
    xq, inter = rounded(x.float(), group), down.shape[2]
    out = torch.zeros(*ids.shape, x.shape[1], device=x.device)

    def round_(a):
        return a.to(x.dtype).float()

    for e in ids.unique().tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        gate, up = (xq[tokens] @ gate_up[e].T).split(inter, 1)
        act = rounded(round_(round_(F.silu(round_(gate))) * round_(up)), act_group)
        out[tokens, slots] = weights[tokens, slots, None].float() * (act @ down[e].T)
    return out


def assert_activation_rounding(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Within e4m3's rounding of the activations (x, silu(gate) * up: <= 2^-4 of a value each, ~2.6% RMS; the
    difference's norm measured 3.6-4.2% of the output's on the CPU tests) of the reference, which
    multiplies them as they are: 10% of the output's norm (a wrong scale or row is off by its own size)."""
    err = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 0.1, err
