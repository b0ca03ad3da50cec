"""This process's tensor-parallel rank and the collectives of the split layers (``layers.py``).

The ranks of one engine form torch.distributed's default group: gloo on the CPU, NCCL on CUDA
(``worker.py`` starts them). Without a group (one rank) every collective is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_split() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> int:
    return dist.get_world_size() if is_split() else 1


def rank() -> int:
    return dist.get_rank() if is_split() else 0


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks, in place."""
    if is_split():
        dist.all_reduce(t)
    return t


def all_gather_columns(t: torch.Tensor) -> torch.Tensor:
    """[n, c] per rank -> [n, world * c]: rank r's columns at r * c."""
    if not is_split():
        return t
    out = t.new_empty((world() * t.shape[0], t.shape[1]))
    dist.all_gather_into_tensor(out, t.contiguous())
    return out.view(world(), t.shape[0], t.shape[1]).transpose(0, 1).reshape(t.shape[0], -1)
