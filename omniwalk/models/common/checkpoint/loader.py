"""Building a family's components in place and filling them: the backends they are built for,
random weights, and the check that the components take every tensor of a checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from omniwalk.errors import CheckpointError
from omniwalk.models.common.checkpoint.weights import checkpoint_files


@dataclass(frozen=True)
class Backends:
    attention: str = "reference"  # varlen attention for the encoders
    moe: str = "reference"
    decoder_kernels: str = "reference"  # "fused": the fused decoder kernels (``decoder.use_kernels``)
    persistent_decode: str = "reference"  # "triton": small batches' steps in one launch where a module has one


REFERENCE = Backends()  # the CPU reference implementations


def build_on(device, dtype: torch.dtype, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` directly on ``device`` with ``dtype`` as the default dtype, so parameters are
    allocated once, in place, and buffers computed in ``__init__`` get real values there."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            return build()
    finally:
        torch.set_default_dtype(previous)


def check_all_taken(ckpt_dir, prefixes: Iterable[str]) -> None:
    """A tensor of the checkpoint that no component's prefix takes is an error, like a missing one."""
    taken = tuple(prefixes)
    stray = sorted(n for n in checkpoint_files(ckpt_dir) if not n.startswith(taken))
    if stray:
        raise CheckpointError(f"{ckpt_dir}: {len(stray)} tensor(s) no component takes: {stray[:8]}")


@torch.no_grad()
def randomize(module: nn.Module, seed: int) -> None:
    """Random weights made on the parameters' device (no host copies, so a 35B model takes
    seconds): matrices ~ N(0, 1/fan_in), vectors around 1 (norm weights) or 0 (biases, scales)."""
    for i, (name, p) in enumerate(module.named_parameters()):
        if p.numel() == 0:  # (e.g. an empty conv of HF's token2wav at tiny sizes)
            continue
        g = torch.Generator(device=p.device).manual_seed(seed * 100_003 + i)
        if p.dim() == 1:
            base = 1.0 if name.endswith("weight") and ("norm" in name or "ln_" in name) else 0.0
            p.normal_(base, 0.1, generator=g)
        else:
            fan_in = p.shape[-1] if "experts" in name else p[0].numel()
            p.normal_(0.0, fan_in**-0.5, generator=g)
