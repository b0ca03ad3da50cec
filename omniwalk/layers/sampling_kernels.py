"""Fused sampling kernels (Triton, CUDA): ``sampling.draw`` in one or two launches per draw.

They compute the ids of ``sampling.draw_reference`` (the PyTorch expression, the oracle) from the
same ``BatchParams``: repetition penalty, banned ids and temperature with the same fp32 rounding
steps, top-k by rank then top-p, the same splitmix64 Gumbel noise (libdevice ``logf`` on CUDA,
as torch's ``log``), argmax with the first index winning ties. Optional fields that are None
are skipped by runtime branches inside one compiled kernel per (logits dtype, block), so eager
draws and CUDA graphs (every field present, neutral rows) share the kernels.

Policy by vocabulary size (no switch):

    vocab <= 4096 (talker 3072, code predictor 2048): one program per row, the row held whole
        in registers -> ``draw_rows``, one launch. Top-k/top-p sort (score, index) keys: a
        partial sort (``tl.topk`` of 64) when the row's top_k <= 64, else the full row.
    vocab > 4096 (thinker 152064): ``draw_blocks`` over (row, 2048-wide block) then
        ``pick_blocks``, two launches. When top-k/top-p are asked, ``sampling.draw`` runs the
        PyTorch ``_top_k_top_p`` (torch.sort) between a processing launch and the draw.

Measured on the H200 (``benchmarks/sampling.py``, results/2026-12-01-h200/sampling): a draw
replayed in a CUDA graph, 59-63 kernels and 114-156 us -> 1 kernel and 12.6 us (2048 ids) or
23 us (3072 ids) at B = 1..32; a plain thinker draw (152064 ids), 44 kernels -> 2.

Ties: keys order by (score desc, index asc): the order of the stable ``torch.sort`` in the
reference; -0.0 and +0.0 are one score there, so the keys merge them. The one place the ids can
differ is the top-p cut: the kernel sums the softmax and its cumulative mass in its own order,
so where the mass of the better tokens lies within rounding (~1e-6) of ``top_p`` the cut may
fall one token apart (tests count such rows separately).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from omniwalk.layers import pdl

SMALL_VOCAB_MAX = 4096  # rows up to this many ids are one program each
TOP_CANDIDATES = 64  # top_k up to this takes the partial sort (talker and code predictor: 50)
LARGE_BLOCK = 2048  # ids per program for larger vocabularies
_PENALTY, _BANNED, _TOP, _SAMPLED = 1, 2, 4, 8  # bits of ``flags``: which BatchParams fields are present


@functools.cache
def available() -> bool:
    return importlib.util.find_spec("triton") is not None


def draw(logits: torch.Tensor, p, step_offset: int = 0, processed: bool = False) -> torch.Tensor:
    """Ids [B] int64 drawn from raw ``logits`` [B, V] with ``p`` (a ``sampling.BatchParams``).
    ``processed``: ``logits`` are already the processed, top-k/top-p filtered fp32 scores (the
    large-vocabulary path; only V > SMALL_VOCAB_MAX). No host reads: graph-capturable."""
    num_rows, vocab = logits.shape
    if processed and vocab <= SMALL_VOCAB_MAX:
        raise ValueError("processed scores are drawn only for vocabularies over SMALL_VOCAB_MAX")
    out = torch.empty(num_rows, dtype=torch.long, device=logits.device)
    if num_rows == 0:
        return out
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    args, flags = _param_args(p, logits.device, skip_front=processed)
    k = _kernels()
    if vocab <= SMALL_VOCAB_MAX:
        block = 1 << (vocab - 1).bit_length()
        k.draw_rows[(num_rows,)](
            logits, logits.stride(0), *args, out, vocab, flags, step_offset,
            BLOCK=block, CANDIDATES=min(TOP_CANDIDATES, block), num_warps=16 if block >= 2048 else 4,
            **pdl.launch(logits.device),
        )  # fmt: skip
        return out
    num_blocks = -(-vocab // LARGE_BLOCK)
    best = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=logits.device)
    best_at = torch.empty(num_rows, num_blocks, dtype=torch.int32, device=logits.device)
    k.draw_blocks[(num_rows, num_blocks)](
        logits, logits.stride(0), *args, best, best_at, vocab, flags, step_offset,
        PROCESS=not processed, PICK=True, BLOCK=LARGE_BLOCK, num_warps=4, **pdl.launch(logits.device),
    )  # fmt: skip
    pad = 1 << (num_blocks - 1).bit_length()
    k.pick_blocks[(num_rows,)](best, best_at, out, num_blocks, BLOCKS_PAD=pad, num_warps=1, **pdl.launch(logits.device))
    return out


def process(logits: torch.Tensor, p) -> torch.Tensor:
    """Penalty, banned ids and temperature of ``p`` applied: fp32 scores [B, V], one launch
    (the large-vocabulary path's input to the PyTorch top-k/top-p)."""
    num_rows, vocab = logits.shape
    scores = torch.empty(num_rows, vocab, dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return scores
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    args, flags = _param_args(p, logits.device, skip_front=False)
    _kernels().draw_blocks[(num_rows, -(-vocab // LARGE_BLOCK))](
        logits, logits.stride(0), *args, scores, scores, vocab, flags, 0,
        PROCESS=True, PICK=False, BLOCK=LARGE_BLOCK, num_warps=4, **pdl.launch(logits.device),
    )  # fmt: skip
    return scores


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernels' noise [B, V] fp32 (for tests against ``sampling.gumbel_noise``)."""
    out = torch.empty(seeds.shape[0], vocab, dtype=torch.float32, device=seeds.device)
    if seeds.shape[0]:
        _kernels().noise_rows[(seeds.shape[0], -(-vocab // 1024))](seeds, steps, out, vocab, BLOCK=1024)
    return out


def _param_args(p, device, skip_front: bool) -> tuple[list, int]:
    """``p``'s tensors in kernel order (typed empty stand-ins for None fields) and the flags."""
    empty = {dt: torch.empty(0, dtype=dt, device=device) for dt in (torch.float32, torch.bool, torch.long)}
    front = not skip_front
    present = {
        _PENALTY: front and p.penalty is not None,
        _BANNED: front and p.banned is not None,
        _TOP: front and p.top_k is not None,
        _SAMPLED: p.sampled is not None,
    }
    seen = p.seen if present[_PENALTY] else empty[torch.bool]
    banned = p.banned if present[_BANNED] else empty[torch.bool]
    args = [
        p.temperature if front else empty[torch.float32],
        p.penalty if present[_PENALTY] else empty[torch.float32],
        seen, seen.stride(0) if seen.dim() == 2 else 0,
        banned, banned.stride(0) if banned.dim() == 2 else 0,
        p.top_k if present[_TOP] else empty[torch.long],
        p.top_p if present[_TOP] else empty[torch.float32],
        *((p.sampled, p.seeds, p.steps) if present[_SAMPLED] else (empty[torch.bool], *[empty[torch.long]] * 2)),
    ]  # fmt: skip
    return args, sum(bit for bit, on in present.items() if on)


@functools.cache
def _kernels():
    """The jit module, imported on first use (triton is needed only where a CUDA draw happens)."""
    return importlib.import_module("omniwalk.layers.sampling_triton")
