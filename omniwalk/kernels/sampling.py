"""Fused sampling kernels (Triton, CUDA): ``omniwalk/sampling.draw`` in one or two launches per draw.

They compute the ids of ``sampling.draw_reference`` (the PyTorch expression, the oracle) from the
same ``BatchParams``: repetition penalty, banned ids, the grammar bitmask and temperature with the same fp32 rounding
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

A draw replayed in a CUDA graph takes one kernel where the PyTorch expression takes about sixty
(``benchmarks/kernels/sampling.py``; docs/performance.md).

Ties: keys order by (score desc, index asc): the order of the stable ``torch.sort`` in the
reference; -0.0 and +0.0 are one score there, so the keys merge them. The one place the ids can
differ is the top-p cut: the kernel sums the softmax and its cumulative mass in its own order,
so where the mass of the better tokens lies within rounding (~1e-6) of ``top_p`` the cut may
fall one token apart (tests count such rows separately).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl

SMALL_VOCAB_MAX = 4096  # rows up to this many ids are one program each
TOP_CANDIDATES = 64  # top_k up to this takes the partial sort (talker and code predictor: 50)
LARGE_BLOCK = 2048  # ids per program for larger vocabularies
_PENALTY, _BANNED, _TOP, _SAMPLED, _ALLOWED = 1, 2, 4, 8, 16  # bits of ``flags``: BatchParams fields present


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
    if vocab <= SMALL_VOCAB_MAX:
        block = 1 << (vocab - 1).bit_length()
        draw_rows[(num_rows,)](
            logits,
            logits.stride(0),
            *args,
            out,
            vocab,
            flags,
            step_offset,
            BLOCK=block,
            CANDIDATES=min(TOP_CANDIDATES, block),
            num_warps=16 if block >= 2048 else 4,
            **pdl.launch(logits.device),
        )
        return out
    num_blocks = -(-vocab // LARGE_BLOCK)
    best = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=logits.device)
    best_at = torch.empty(num_rows, num_blocks, dtype=torch.int32, device=logits.device)
    draw_blocks[(num_rows, num_blocks)](
        logits,
        logits.stride(0),
        *args,
        best,
        best_at,
        vocab,
        flags,
        step_offset,
        PROCESS=not processed,
        PICK=True,
        BLOCK=LARGE_BLOCK,
        num_warps=4,
        **pdl.launch(logits.device),
    )
    pad = 1 << (num_blocks - 1).bit_length()
    pick_blocks[(num_rows,)](best, best_at, out, num_blocks, BLOCKS_PAD=pad, num_warps=1, **pdl.launch(logits.device))
    return out


def process(logits: torch.Tensor, p) -> torch.Tensor:
    """Penalty, banned and disallowed ids and temperature of ``p`` applied: fp32 scores [B, V], one launch
    (the large-vocabulary path's input to the PyTorch top-k/top-p)."""
    num_rows, vocab = logits.shape
    scores = torch.empty(num_rows, vocab, dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return scores
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    args, flags = _param_args(p, logits.device, skip_front=False)
    draw_blocks[(num_rows, -(-vocab // LARGE_BLOCK))](
        logits,
        logits.stride(0),
        *args,
        scores,
        scores,
        vocab,
        flags,
        0,
        PROCESS=True,
        PICK=False,
        BLOCK=LARGE_BLOCK,
        num_warps=4,
        **pdl.launch(logits.device),
    )
    return scores


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernels' noise [B, V] fp32 (for tests against ``sampling.gumbel_noise``)."""
    out = torch.empty(seeds.shape[0], vocab, dtype=torch.float32, device=seeds.device)
    if seeds.shape[0]:
        noise_rows[(seeds.shape[0], -(-vocab // 1024))](seeds, steps, out, vocab, BLOCK=1024)
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
        _ALLOWED: front and p.allowed is not None,
    }
    seen = p.seen if present[_PENALTY] else empty[torch.bool]
    banned = p.banned if present[_BANNED] else empty[torch.bool]
    allowed = p.allowed if present[_ALLOWED] else torch.empty(0, dtype=torch.int32, device=device)
    args = [
        p.temperature if front else empty[torch.float32],
        p.penalty if present[_PENALTY] else empty[torch.float32],
        seen,
        seen.stride(0) if seen.dim() == 2 else 0,
        banned,
        banned.stride(0) if banned.dim() == 2 else 0,
        allowed,
        allowed.stride(0) if allowed.dim() == 2 else 0,
        p.top_k if present[_TOP] else empty[torch.long],
        p.top_p if present[_TOP] else empty[torch.float32],
        *((p.sampled, p.seeds, p.steps) if present[_SAMPLED] else (empty[torch.bool], *[empty[torch.long]] * 2)),
    ]
    return args, sum(bit for bit, on in present.items() if on)


@triton.jit
def mix(z):  # splitmix64's finaliser on uint64: products wrap modulo 2^64, >> is logical
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def gumbel(seed, step, cols):
    """sampling.gumbel_noise for one row: (seed, step, vocabulary index) -> Gumbel(0, 1)."""
    key = mix(seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + step.to(tl.uint64, bitcast=True))
    z = mix(key + (cols + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)
    u = ((z >> 41).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # 23 random bits -> (0, 1)
    return -tl.log(-tl.log(u))


@triton.jit
def front(
    x,
    row,
    cols,
    valid,
    flags,
    temperature_ptr,
    penalty_ptr,
    seen_ptr,
    seen_stride,
    banned_ptr,
    banned_stride,
    allowed_ptr,
    allowed_stride,
):
    """Repetition penalty, banned ids, the grammar's bitmask, temperature: the reference's fp32 steps, in its order."""
    if (flags & 1) != 0:
        penalty = tl.load(penalty_ptr + row)
        seen = tl.load(seen_ptr + row * seen_stride + cols, mask=valid, other=0) != 0
        x = tl.where(seen, tl.where(x > 0, tl.div_rn(x, penalty), x * penalty), x)
    if (flags & 2) != 0:
        banned = tl.load(banned_ptr + row * banned_stride + cols, mask=valid, other=0) != 0
        x = tl.where(banned, float("-inf"), x)
    if (flags & 16) != 0:
        words = tl.load(allowed_ptr + row * allowed_stride + (cols >> 5), mask=valid, other=0)
        x = tl.where(((words >> (cols & 31)) & 1) != 0, x, float("-inf"))
    return tl.div_rn(x, tl.load(temperature_ptr + row))


@triton.jit
def front_of(x, row, cols, valid, flags, params):
    """``front`` with the parameters' pointers and strides of ``params`` (``draw_rows``' order)."""
    temperature_ptr, penalty_ptr, seen_ptr, seen_stride, banned_ptr, banned_stride, allowed_ptr = params[:7]
    return front(
        x,
        row,
        cols,
        valid,
        flags,
        temperature_ptr,
        penalty_ptr,
        seen_ptr,
        seen_stride,
        banned_ptr,
        banned_stride,
        allowed_ptr,
        params[7],
    )


@triton.jit
def perturb(x, row, cols, flags, step_offset, sampled_ptr, seeds_ptr, steps_ptr):
    """Sampled rows add the Gumbel noise (argmax then draws); greedy rows stay as they are."""
    if (flags & 8) != 0:
        if tl.load(sampled_ptr + row) != 0:
            step = tl.load(steps_ptr + row) + step_offset
            x = x + gumbel(tl.load(seeds_ptr + row), step, cols)
    return x


@triton.jit
def keys_of(x, cols, BLOCK: tl.constexpr):
    """int64 keys ordered as (score desc, index asc) when sorted descending; -0.0 == +0.0."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    order = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed int order
    return (order.to(tl.int64) << 32) | (BLOCK - 1 - cols).to(tl.int64)


@triton.jit
def scores_of(keys):
    order = (keys >> 32).to(tl.int32)
    return (order ^ ((order >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def cut(sorted_keys, top_k, top_p, N: tl.constexpr):
    """Keys sorted descending [N] -> the smallest key that top-k then top-p keep (a prefix)."""
    ranks = tl.arange(0, N)
    scores = tl.where(ranks < top_k, scores_of(sorted_keys), float("-inf"))
    e = tl.exp(scores - tl.max(scores, 0))
    probs = e / tl.sum(e, 0)
    before = tl.cumsum(probs, 0) - probs  # mass of the better tokens
    limit = tl.where(top_p < 1.0, top_p, float("inf"))  # (top_p 1: even a mass rounded to 1 keeps)
    drop = ((before >= limit) & (ranks > 0)) | (ranks >= top_k)
    num_kept = tl.min(tl.where(drop, ranks, N), 0)
    return tl.min(tl.where(ranks < num_kept, sorted_keys, 0x7FFFFFFFFFFFFFFF), 0)


@triton.jit
def keeps_set(top_k, top_p, vocab):
    """Whether a row's top_k / top_p keep fewer ids than the whole vocabulary (a sorted set to cut)."""
    return (top_k < vocab) | (top_p < 1.0)


@triton.jit
def top_k_top_p(x, row, cols, vocab, top_k_ptr, top_p_ptr, BLOCK: tl.constexpr, CANDIDATES: tl.constexpr):
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    if keeps_set(top_k, top_p, vocab):  # (neutral rows of a graph skip the sort)
        keys = keys_of(x, cols, BLOCK)
        if top_k <= CANDIDATES:
            smallest = cut(tl.topk(keys, CANDIDATES), top_k, top_p, CANDIDATES)
        else:
            smallest = cut(tl.sort(keys, descending=True), top_k, top_p, BLOCK)
        x = tl.where(keys >= smallest, x, float("-inf"))
    return x


@triton.jit(do_not_specialize=["flags", "step_offset"])
def draw_rows(
    logits_ptr,
    logits_stride,
    temperature_ptr,
    penalty_ptr,
    seen_ptr,
    seen_stride,
    banned_ptr,
    banned_stride,
    allowed_ptr,
    allowed_stride,
    top_k_ptr,
    top_p_ptr,
    sampled_ptr,
    seeds_ptr,
    steps_ptr,
    out_ptr,
    vocab,
    flags,
    step_offset,
    BLOCK: tl.constexpr,
    CANDIDATES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if USE_PDL:  # (omniwalk.kernels.pdl)
        gdc_wait()
        gdc_launch_dependents()
    cols = tl.arange(0, BLOCK)
    valid = cols < vocab
    x = tl.load(logits_ptr + row * logits_stride + cols, mask=valid, other=float("-inf")).to(tl.float32)
    args = (temperature_ptr, penalty_ptr, seen_ptr, seen_stride, banned_ptr, banned_stride, allowed_ptr, allowed_stride)
    args += (top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr)
    tl.store(out_ptr + row, pick(x, row, cols, valid, vocab, flags, step_offset, args, BLOCK, CANDIDATES))


@triton.jit
def pick(x, row, cols, valid, vocab, flags, step_offset, params, BLOCK: tl.constexpr, CANDIDATES: tl.constexpr):
    """A row's fp32 scores ``x`` [BLOCK] -> its drawn id (int64): ``front``, top-k / top-p, the noise of a
    sampled row, argmax (``sampling.draw``'s steps). ``params``: the parameters' pointers and strides, in
    ``draw_rows``' order (temperature .. steps)."""
    top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr = params[8:]
    x = front_of(x, row, cols, valid, flags, params)
    if (flags & 4) != 0:
        x = top_k_top_p(x, row, cols, vocab, top_k_ptr, top_p_ptr, BLOCK, CANDIDATES)
    x = perturb(x, row, cols, flags, step_offset, sampled_ptr, seeds_ptr, steps_ptr)
    return tl.argmax(x, 0).to(tl.int64)


@triton.jit
def set_params(row, vocab, flags, top_k_ptr, top_p_ptr):
    """Row ``row``'s top_k and top_p where its draw applies them (flag 4), else neutral (vocab, 1.0)."""
    on = (flags & 4) != 0
    return tl.load(top_k_ptr + row, mask=on, other=vocab), tl.load(top_p_ptr + row, mask=on, other=1.0)


@triton.jit
def ranked(row, vocab, flags, top_k_ptr, top_p_ptr):
    """Whether row ``row`` keeps a top-k / top-p set before its draw (``top_k_top_p`` sorts it)."""
    top_k, top_p = set_params(row, vocab, flags, top_k_ptr, top_p_ptr)
    return keeps_set(top_k, top_p, vocab)


@triton.jit
def whole_row(row, vocab, flags, top_k_ptr, top_p_ptr, CANDIDATES: tl.constexpr):
    """Whether row ``row``'s draw needs its whole row (a top_k over ``CANDIDATES``: the full sort)."""
    top_k, top_p = set_params(row, vocab, flags, top_k_ptr, top_p_ptr)
    return keeps_set(top_k, top_p, vocab) & (top_k > CANDIDATES)


@triton.jit
def part_candidates(
    x, row, cols, valid, vocab, flags, step_offset, params, BLOCK: tl.constexpr, CANDIDATES: tl.constexpr
):
    """A part of a row: its fp32 scores ``x`` (``cols``: their indices in the row, BLOCK: the row's block)
    -> [CANDIDATES] keys (``keys_of``) that ``pick_candidates`` draws from with its other parts': where the
    row keeps a top-k / top-p set, the part's best CANDIDATES keys of its processed scores (the row's best
    CANDIDATES are among the parts'); else the key of its best perturbed score, then the least keys. A row
    whose draw needs the whole row (``whole_row``) is drawn by ``pick`` instead."""
    top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr = params[8:]
    x = front_of(x, row, cols, valid, flags, params)
    if ranked(row, vocab, flags, top_k_ptr, top_p_ptr):
        keys = tl.topk(keys_of(x, cols, BLOCK), CANDIDATES)
    else:
        x = perturb(x, row, cols, flags, step_offset, sampled_ptr, seeds_ptr, steps_ptr)
        best = tl.max(keys_of(x, cols, BLOCK), 0)
        keys = tl.where(tl.arange(0, CANDIDATES) == 0, best, -9223372036854775807 - 1)
    return keys


@triton.jit
def pick_candidates(keys, row, vocab, flags, step_offset, params, BLOCK: tl.constexpr, CANDIDATES: tl.constexpr):
    """A row's parts' keys (``part_candidates``, all of them in one tensor) -> its drawn id (int64), the
    id ``pick`` draws from the whole row: the best CANDIDATES keys, cut by top-k then top-p, their scores
    perturbed, the best (the first index winning ties); else the best of the parts' best perturbed keys."""
    top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr = params[8:]
    if ranked(row, vocab, flags, top_k_ptr, top_p_ptr):
        top = tl.topk(keys, CANDIDATES)
        smallest = cut(top, tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), CANDIDATES)
        cols = BLOCK - 1 - (top & 0xFFFFFFFF).to(tl.int32)
        x = tl.where(top >= smallest, scores_of(top), float("-inf"))
        x = perturb(x, row, cols, flags, step_offset, sampled_ptr, seeds_ptr, steps_ptr)
        best = tl.max(keys_of(x, cols, BLOCK), 0)
    else:
        best = tl.max(keys, 0)
    return BLOCK - 1 - (best & 0xFFFFFFFF)


@triton.jit(do_not_specialize=["flags", "step_offset"])
def draw_blocks(
    logits_ptr,
    logits_stride,
    temperature_ptr,
    penalty_ptr,
    seen_ptr,
    seen_stride,
    banned_ptr,
    banned_stride,
    allowed_ptr,
    allowed_stride,
    top_k_ptr,
    top_p_ptr,
    sampled_ptr,
    seeds_ptr,
    steps_ptr,
    best_ptr,
    best_at_ptr,
    vocab,
    flags,
    step_offset,
    PROCESS: tl.constexpr,
    PICK: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """PICK: each block's best (perturbed) score and its first index; else the processed scores."""
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if USE_PDL:  # (omniwalk.kernels.pdl)
        gdc_wait()
        gdc_launch_dependents()
    cols = block * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    x = tl.load(logits_ptr + row * logits_stride + cols, mask=valid, other=float("-inf")).to(tl.float32)
    if PROCESS:
        x = front(
            x,
            row,
            cols,
            valid,
            flags,
            temperature_ptr,
            penalty_ptr,
            seen_ptr,
            seen_stride,
            banned_ptr,
            banned_stride,
            allowed_ptr,
            allowed_stride,
        )
    if PICK:
        x = perturb(x, row, cols, flags, step_offset, sampled_ptr, seeds_ptr, steps_ptr)
        best, at = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(best_ptr + row * tl.num_programs(1) + block, best)
        tl.store(best_at_ptr + row * tl.num_programs(1) + block, block * BLOCK + at)
    else:
        tl.store(best_ptr + row * vocab + cols, x, mask=valid)


@triton.jit
def pick_blocks(best_ptr, best_at_ptr, out_ptr, num_blocks, BLOCKS_PAD: tl.constexpr, USE_PDL: tl.constexpr):
    """Per row: the first block holding the maximum (so the first index overall wins ties)."""
    row = tl.program_id(0).to(tl.int64)
    if USE_PDL:  # (omniwalk.kernels.pdl)
        gdc_wait()
        gdc_launch_dependents()
    i = tl.arange(0, BLOCKS_PAD)
    valid = i < num_blocks
    best = tl.load(best_ptr + row * num_blocks + i, mask=valid, other=float("-inf"))
    at = tl.load(best_at_ptr + row * num_blocks + i, mask=valid, other=0)
    first = tl.argmax(best, 0)
    tl.store(out_ptr + row, tl.sum(tl.where(i == first, at, 0), 0).to(tl.int64))


@triton.jit
def noise_rows(seeds_ptr, steps_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    noise = gumbel(tl.load(seeds_ptr + row), tl.load(steps_ptr + row), cols)
    tl.store(out_ptr + row * vocab + cols, noise, mask=cols < vocab)
