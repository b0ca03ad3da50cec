"""This process's tensor-parallel rank and the collectives of the split layers (``layers.py``).

The ranks of one engine form torch.distributed's default group: gloo on the CPU, NCCL on CUDA
(``worker.py`` starts them). Without a group (one rank) every collective is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from omniwalk.errors import ConfigError

_control = None  # the gloo group of the per-step control messages (lockstep.py)


def set_control_group(group) -> None:
    global _control
    _control = group


def control_group():
    return _control


def is_split() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> int:
    return dist.get_world_size() if is_split() else 1


def rank() -> int:
    return dist.get_rank() if is_split() else 0


def rank_of(tensor_parallel: int) -> int:
    """This process's rank in an engine of ``tensor_parallel`` ranks (0 for an engine of one, even
    in a process that is a rank of another; a ConfigError when the group is not that size)."""
    if tensor_parallel == 1:
        return 0
    if world() != tensor_parallel:
        raise ConfigError(
            f"tensor_parallel is {tensor_parallel} but {world()} rank(s) run (omniwalk/parallel/group.py)"
        )
    return rank()


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks, in place."""
    if is_split():
        dist.all_reduce(t)
    return t


def all_gather_columns(t: torch.Tensor) -> torch.Tensor:
    """[n, c] per rank -> [n, world * c]: rank r's columns at r * c."""
    if not is_split():
        return t
    parts = [torch.empty_like(t) for _ in range(world())]
    dist.all_gather(parts, t.contiguous())  # (all_gather_into_tensor is deprecated in torch 2.13, its successor new)
    return torch.cat(parts, dim=1)
