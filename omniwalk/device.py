"""Host -> device transfers that never stall the step loop.

A plain ``torch.tensor(values, device="cuda")`` copies from pageable memory and synchronises the
stream. The step loop builds small index/position tensors on the host every step, so it copies
them from pinned memory, asynchronously, instead. On the CPU this is a plain tensor.
"""

from __future__ import annotations

import torch


def to_device(values, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A list (or CPU tensor) -> a tensor on ``device`` without a host synchronisation."""
    cuda = torch.device(device).type == "cuda"
    if not isinstance(values, torch.Tensor):  # (made in pinned memory at once: one host copy less)
        return torch.tensor(values, dtype=dtype, pin_memory=cuda).to(device, non_blocking=cuda)
    t = values if dtype is None or values.dtype == dtype else values.to(dtype)
    return t.pin_memory().to(device, non_blocking=True) if cuda else t.to(device)


class HostCopy:
    """A device tensor on its way to the host: the copy is queued now (pinned, asynchronous),
    ``get()`` waits for it. Lets a step queue its reads and do other launches before waiting."""

    def __init__(self, t: torch.Tensor):
        self.event = None
        if t.is_cuda:
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t

    def get(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()  # NOTE: the step's wait for its read
        return self.host
