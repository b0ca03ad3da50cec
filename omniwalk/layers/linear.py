"""Linear layers of the decoders' fast path.

``SkinnyLinear`` is the module the fused decoder kernels (``decoder_kernels="fused"``) put in place of
a merged nn.Linear once the weights are loaded: up to ``MAX_ROWS`` rows through the skinny GEMM
(``kernels/skinny_gemm.py``, where the tuned tiles do not name cuBLAS), ``F.linear`` above (prefill),
where cuBLAS's tensor-core tiles are full (FP8: of a dequantised copy). ``MergesProjections`` marks
the modules that merge their projections on that path; ``stacked_linear`` is the merge for cuBLAS.
``LoraRows`` adds the LoRA adapters of a forward's rows to a projection's output (``omniwalk/lora/``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.layers.fp8 import Block, Fp8Linear, concat_rows
from omniwalk.layers.norm import RMSNorm


@functools.cache
def _kernels():
    """The Triton modules this layer launches (imported on first use: they import Triton)."""
    return tuple(importlib.import_module(f"omniwalk.kernels.{name}") for name in ("skinny_gemm", "silu_mul", "fp8"))


# The LoRA shrink folds into a projection's skinny GEMM while the pool's A rows of every slot (each row of the
# batch computes all of them, and keeps its own slot's) are at most this share of the projection's rows.
FOLDED_SHRINK_SHARE = 1 / 8


class LoraExpand(NamedTuple):
    """A LoRA expand still to add to a projection's output: t [n, S * R] (every slot's shrink of each row, in
    B's dtype, slot s at columns s * R ...; fp32 split-K partial sums [n, splits, S * R] after a split product),
    b [S, out, R] (the pool's B), slots [n] int32 (-1: the base model)."""

    t: torch.Tensor
    b: torch.Tensor
    slots: torch.Tensor


@dataclass(frozen=True)
class LoraRows:
    """The LoRA adapters of one forward's rows: ``slots`` [n] int32 on the device, each row's slot of the
    adapter pool (-1: the base model; its rows are left untouched, bit for bit), and the pool's weights per
    (layer, module): ``a`` [slots, rank, in], ``b`` [slots, out, rank] (``omniwalk/lora/pool.py``).
    ``add`` runs after a projection: ``y[i] += B[slot] (A[slot] x[i])`` (``lora.ops.add_lora``); y may be a
    column slice of a merged projection's output, or its first split-K partial sum ([n, S, out]: the next
    ``RMSNorm.add`` sums them, so adding to one adds to the sum)."""

    slots: torch.Tensor
    a: Mapping[tuple[int, str], torch.Tensor]
    b: Mapping[tuple[int, str], torch.Tensor]
    backend: str = "reference"

    def holds(self, layer: int, module: str) -> bool:
        """Whether the pool holds (layer, module): a merged projection's key when its adapters are merged."""
        return (layer, module) in self.a

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
        """Add the adapters of (layer, module) to y (in place; returned for chaining). x [n, in], y [n, out]."""
        key = (layer, module)
        if key in self.a:
            from omniwalk.lora.ops import add_lora

            add_lora(y[:, 0] if y.dim() == 3 else y, x, self.a[key], self.b[key], self.slots, self.backend)
        return y

    def project(self, projection: nn.Module, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
        """``projection(x)`` with the adapters of (layer, module) added: the shrink folded into the projection
        where ``fold`` does it, then one expand kernel; else ``add`` after the projection."""
        folded = self.fold(projection, x, layer, module)
        if folded is None:
            return self.add(projection(x), x, layer, module)
        from omniwalk.kernels.lora import expand_lora_triton

        y, (t, b, slots) = folded
        expand_lora_triton(y[:, 0] if y.dim() == 3 else y, t, b, slots)
        return y

    def fold(
        self, projection: nn.Module, x: torch.Tensor, layer: int, module: str
    ) -> tuple[torch.Tensor, LoraExpand] | None:
        """(``projection(x)`` without the adapters, their expand still to do) where the projection is a skinny
        GEMM that takes the pool's A rows of every slot as more weight rows (the Triton backend; those rows at
        most ``FOLDED_SHRINK_SHARE`` of the projection's), the shrink so costing no launch; else None."""
        a = self.a.get((layer, module))
        if a is None or self.backend != "triton" or not isinstance(projection, SkinnyLinear):
            return None
        rows = a.view(-1, a.shape[-1])
        if rows.shape[0] > FOLDED_SHRINK_SHARE * projection.weight.shape[0]:
            return None
        both = projection.with_rows(x, rows)
        return None if both is None else (both[0], LoraExpand(both[1], self.b[(layer, module)], self.slots))


class MergesProjections(nn.Module):
    """A module whose projections the fused decoder kernels merge (into ``SkinnyLinear``s, or
    ``stacked_linear``s for prefill-sized inputs) once the weights are loaded
    (``decoder.use_fused_kernels`` calls ``merge_projections`` on each)."""

    def merge_projections(self) -> None:
        raise NotImplementedError


def stacked_linear(weights: list[torch.Tensor], biases: list[torch.Tensor]) -> nn.Linear:
    """One biased ``nn.Linear`` whose outputs are those of the given (weight, bias) pairs, in order (a
    merge for cuBLAS: the encoders' and the DiT's projections, which prefill-sized inputs keep off the GEMV)."""
    w = torch.cat(weights)
    linear = nn.Linear(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype)
    linear.weight.data.copy_(w)
    linear.bias.data.copy_(torch.cat(biases))
    return linear


class SkinnyLinear(nn.Module):
    """A Linear (``weight`` [N, K], the checkpoint's layout; an optional ``bias`` [N]) for the decode
    fast path: up to ``skinny_gemm.MAX_ROWS`` rows through the skinny GEMM, more through ``F.linear``.

    ``gated``: ``weight`` is a merged gate/up projection and the output is silu(gate) * up.
    ``partials``: the output may be fp32 partial sums [M, S, N] (the module's consumer sums them,
    e.g. the decoder's next ``RMSNorm.add``); only for 2-D inputs.
    ``scale``/``block``: ``weight`` is FP8 with this scale_inv grid (``layers/fp8.py``); the kernel reads
    it as stored, ``F.linear`` (more rows) a dequantised copy (``kernels/fp8.dequantize_triton``, one kernel).
    A ``bias`` goes with a plain product only (neither gated nor partial sums).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        gated: bool = False,
        partials: bool = False,
        scale: torch.Tensor | None = None,
        block: Block | None = None,
        bias: torch.Tensor | None = None,
    ):
        super().__init__()
        if bias is not None and (gated or partials):
            raise ValueError("a SkinnyLinear with a bias is a plain product (neither gated nor partial sums)")
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = None if scale is None else nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.gated, self.partials, self.block = gated, partials, block

    @classmethod
    def merge(cls, *parts: nn.Linear | Fp8Linear, gated: bool = False, partials: bool = False) -> SkinnyLinear:
        """One SkinnyLinear whose output rows are ``parts``' outputs, in order (biased parts: their
        biases concatenated too; every part has one or none does)."""
        biases = [getattr(p, "bias", None) for p in parts]
        if any(b is None for b in biases) and any(b is not None for b in biases):
            raise ValueError("merged projections either all have biases or none has")
        bias = None if biases[0] is None else torch.cat([b.data for b in biases])
        if isinstance(parts[0], Fp8Linear):
            q, scale, block = concat_rows([(p.weight.data, p.weight_scale_inv.data) for p in parts], parts[0].block)
            return cls(q, gated, partials, scale, block, bias)
        return cls(torch.cat([p.weight.data for p in parts]), gated, partials, bias=bias)

    def normed(self, norm: RMSNorm, h: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``norm.add(h, delta)`` into this projection -> (h + delta, the projection of its norm): one
        kernel where the norm folds into the GEMV (``normed_skinny_gemm``: one row, the norm's fast path,
        a delta of at most ``skinny_gemm.MAX_FOLDED_PARTS`` parts), else the norm's kernel and then this one."""
        sg = _kernels()[0]
        rows, k = h.numel() // h.shape[-1], h.shape[-1]
        n, fp8 = self.weight.shape[0] // 2 if self.gated else self.weight.shape[0], self.weight_scale_inv is not None
        blocks = sg.pick_blocks(rows, n, k, self.gated, False, fp8, h.device) if rows == 1 else None
        parts = 0 if delta is None else 1 if delta.dim() == h.dim() else delta.shape[-2]
        if norm.kernel is None or blocks is None or blocks.rows > 1 or parts > sg.MAX_FOLDED_PARTS:
            h, x = norm.add(h, delta)
            return h, self(x)
        h_out, y = sg.normed_skinny_gemm(
            sg.InputNorm(h.reshape(1, k), delta, norm.weight, norm.eps),
            self.weight,
            gated=self.gated,
            blocks=blocks,
            scale=self.weight_scale_inv,
            scale_block=self.block,
            bias=self.bias,
        )
        return h_out.view(h.shape), y.view(*h.shape[:-1], y.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply(x, self.gated)

    def with_rows(self, x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(this projection of x [n, K], x @ rows^T) in one skinny GEMM (``skinny_gemm_with_rows``: ``rows``
        [E, K] as more weight rows, no bias; [n, S, E] partial sums where the product is split), or None
        where that kernel does not run: more than ``MAX_ROWS`` rows, FP8 or gated weights. Where the tuned
        entry names cuBLAS for the bare product, the generic tile (``default_blocks``): the launch it saves
        is worth more than cuBLAS's edge on one GEMV."""
        sg = _kernels()[0]
        (n, k), m = self.weight.shape, x.shape[0]
        if x.dim() != 2 or self.gated or self.weight_scale_inv is not None or m > sg.MAX_ROWS:
            return None
        blocks = sg.pick_blocks(m, n, k, False, self.partials, False, x.device)
        blocks = blocks or sg.default_blocks(m, n, k, self.partials)
        return sg.skinny_gemm_with_rows(x, self.weight, rows, partials=self.partials, blocks=blocks, bias=self.bias)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """A gated projection's plain product [..., 2I] (gate then up, before silu·mul): what LoRA
        adapters of the gate and up projections add to (``GatedMLP``)."""
        return self._apply(x, gated=False)

    def _apply(self, x: torch.Tensor, gated: bool) -> torch.Tensor:
        sg, silu_mul, fp8_kernels = _kernels()
        flat = x.reshape(-1, x.shape[-1])
        (n, k), m = self.weight.shape, flat.shape[0]
        partials = self.partials and x.dim() == 2
        n = n // 2 if gated else n
        fp8 = self.weight_scale_inv is not None
        may_split = partials and not gated
        blocks = sg.pick_blocks(m, n, k, gated, may_split, fp8, x.device) if m <= sg.MAX_ROWS else None
        if blocks is None:
            w = self.weight
            if fp8:
                w = fp8_kernels.dequantize_triton(self.weight, self.weight_scale_inv, self.block, x.dtype)
            y = F.linear(x, w, self.bias)
            return silu_mul.silu_mul_triton(y) if gated else y
        y = sg.skinny_gemm(
            flat,
            self.weight,
            gated=gated,
            partials=partials,
            blocks=blocks,
            scale=self.weight_scale_inv,
            scale_block=self.block,
            bias=self.bias,
        )
        return y if y.dim() == 3 else y.view(*x.shape[:-1], y.shape[-1])
