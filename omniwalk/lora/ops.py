"""The batched LoRA op: ``y[i] += (x[i] @ A[slots[i]].T) @ B[slots[i]].T`` for every row whose slot is
not -1, each row with its own adapter (a pool slot), after a projection ``y = x W.T`` of the thinker.

One arithmetic for every backend: the shrink ``x @ A.T`` accumulates in fp32 and is rounded to the
weights' dtype (as PEFT computes ``lora_A(x)`` in the model's dtype; the expand then runs on tensor
cores), the expand accumulates in fp32, and ``y + delta`` is added in fp32 and rounded once to y's
dtype. Rows with slot -1 (the base model) are left bitwise as they were.

Backends (``LORA`` in ``omniwalk/kernels/registry.py``, chosen by ``ModelConfig.lora_backend``):
"reference" below (PyTorch, any device, the tests' oracle) and "triton" (``omniwalk/kernels/lora.py``).
Both read no value on the host, so a CUDA graph may capture them with the slots as a graph input.
"""

from __future__ import annotations

import torch

from omniwalk.kernels.registry import LORA


def add_lora(
    y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, backend: str = "reference"
) -> None:
    """Add the LoRA delta of each row's slot to ``y`` in place.

    x [M, in]; y [M, out] (may be a column slice of a wider tensor: any row stride); a [S, R, in] and
    b [S, out, R] (a pool's tensors of one projection, ranks zero-padded to R); slots [M] int32 on x's
    device, -1 for a row without an adapter."""
    LORA.load(backend)(y, x, a, b, slots)


def check_shapes(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    m, n_in = x.shape
    num_slots, rank, _ = a.shape
    assert a.shape[2] == n_in and b.shape == (num_slots, y.shape[1], rank), "add_lora: a [S, R, in], b [S, out, R]"
    assert y.shape[0] == m and slots.shape == (m,), "add_lora: y [M, out] and slots [M] for x [M, in]"
    assert not slots.dtype.is_floating_point, "add_lora: slots are integers"


def add_lora_reference(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """The oracle: one masked matmul per slot (the slot count is a shape, so nothing is read on the host)."""
    check_shapes(y, x, a, b, slots)
    xf, rows = x.float(), slots.long()
    shrink = x.new_zeros(x.shape[0], a.shape[1], dtype=torch.float32)
    for s in range(a.shape[0]):
        shrink = torch.where((rows == s)[:, None], xf @ a[s].float().T, shrink)
    shrink = shrink.to(a.dtype).float()
    delta = x.new_zeros(y.shape, dtype=torch.float32)
    for s in range(b.shape[0]):
        delta = torch.where((rows == s)[:, None], shrink @ b[s].float().T, delta)
    y.copy_(torch.where((rows >= 0)[:, None], (y.float() + delta).to(y.dtype), y))
