"""Skinny GEMMs for decode: ``y[M, N] = x[M, K] @ W[N, K]^T`` with few rows (M <= ``MAX_ROWS``),
where the time is the weight read: one kernel that streams each weight byte once.

A program owns ``BLOCK_N`` weight rows (output columns) and a range of K; it computes all M rows
of x against them (``tl.dot`` of the weight tile [BLOCK_N, BLOCK_K] with x^T [BLOCK_K, BLOCK_M],
BLOCK_M = M padded to 16; at M = 1 an fp32 multiply-add over [BLOCK_N, BLOCK_K] reduced once at
the end). Epilogues:

    plain     y in x's dtype, rounded once from the fp32 sum (as cuBLAS rounds its fp32 accumulator);
              with a ``bias`` [N], the sum + bias rounded once (a biased Linear's epilogue)
    gated     W is a merged gate/up weight [2I, K] (gate rows first): y = silu(gate) * up [M, I],
              rounded like ``silu_mul``'s reference (gate and up rounded to the dtype as a GEMM's
              outputs are, silu rounded, then the product): replaces a GEMM + a silu·mul kernel
    partials  split-K without a reduce kernel: S programs per column block each write an fp32
              partial sum, [M, S, N]; the consumer sums them (``RMSNorm.add`` takes [N, S, H] deltas,
              summed in fp32 and rounded once: the rounding of the unsplit product)

A prologue (one row, the GEMV): ``normed_skinny_gemm`` takes the decoder's residual h and a delta
instead of x and computes x = RMSNorm(h + delta) itself, with ``norm.add_rms_norm``'s rounding steps:
each program reads the whole row for its 1 / rms (a GEMV reads it anyway), then normalises its K range
as it goes; the first program stores h + delta. ``SkinnyLinear.normed`` uses it where it fits (the code
predictor's one-token passes: its 11 norms a pass), replacing the norm's kernel.

FP8 weights (``SCALED``; ``fp8.py``'s block-wise format): the GEMV sums x times the e4m3 weights widened
to fp32 16 at a time and multiplies each sum by its K block's scale (a K step is cut into sub-blocks inside
one scale column; the tile is widened as loaded, one step ahead, with ``fp8.triton_widening``: sm_90a SASS
of the thinker qkv GEMV, 3.9 instructions per weight in the loop against 6.2 when the loop carried the
bytes; measured on the H200 no faster for it: the FP8 GEMV streams 0.75-1.6 TB/s, bound by the bytes each
thread has in flight (half bf16's for as many weights), not by instructions. Summing 16 products before
the lane, not keeping a lane per weight, cut its registers 165-173 -> 105-140 and lets a tile hold 128
weights a thread without spilling: session 28, measured on the CPU's sm_90a build only);
the ``tl.dot`` path dequantises each weight tile as ``fp8.dequantize`` does (weight times scale in fp32,
rounded once to x's dtype: its K step inside one scale column) and accumulates through chained dots, so its
products are those of the bf16 model of the dequantised weights up to summation order (scaling each K step's
product after the dot instead kept no product in flight across steps: the chained dot is 6-27% faster at 32
rows on the H200, session 36). x stays in its dtype: quantising it per row and K step too, for an
FP8 x FP8 tensor-core dot, measured slower at M = 2-32 on the H200 (fp8 call 1: 9.5-15 µs against
8.7-13 for the widened weight) and was removed.

``SkinnyLinear`` is the module the CUDA fast path puts in place of a merged nn.Linear (after the
weights are loaded, ``decoder.use_kernels``): the kernel up to ``MAX_ROWS`` rows, ``F.linear``
above (prefill), where cuBLAS's tensor-core tiles are full (FP8: of a dequantised copy).
"""

from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.layers import pdl
from omniwalk.layers.fp8 import Block, Fp8Linear, asm_widening, concat_rows, dequantize_triton
from omniwalk.layers.norm import RMSNorm
from omniwalk.layers.silu_mul import silu_mul_triton

MAX_ROWS = 32  # rows per call through the kernel (where ``TUNED`` does not name cuBLAS); cuBLAS beyond
# A folded norm (``SkinnyLinear.normed``) re-reads the row's delta in every program: the dense decoder's one
# part, not the MoE's 8-10 (left to the norm's kernel; not measured). Folding Qwen2.5-Omni-7B's norms over
# its split o (4) / down (2) partials measured slower: decode step 4.01 -> 4.15 ms (s32 call 2), every
# gate/up program re-reading 4 fp32 rows.
MAX_FOLDED_PARTS = 1


class Blocks(NamedTuple):
    """One launch configuration. ``split``: programs along K per column block (> 1 only where the
    caller takes partial sums); ``rows``: x's rows padded to (0: ``padded_rows``)."""

    n: int  # weight rows per program
    k: int  # K step per loop iteration
    split: int
    warps: int
    stages: int
    rows: int = 0


# (padded rows, N, K, gated, may split) -> Blocks, or None where cuBLAS (+ silu·mul when gated) is
# faster; N is I for a gated product; other shapes get ``default_blocks``. Measured on the H200:
# benchmarks/skinny_gemm.py, run k1/call2 of 2026-12-01 (per key the least total µs over its rows
# 1 / 2, 8, 16 / 32, in CUDA graphs, weights from HBM). µs per call at M = 1, cuBLAS -> this table:
# thinker qkv 7.7 (cuBLAS kept; the kernel's best 8.3), thinker o 8.6 -> 6.5, talker qkv 4.8 -> 3.9,
# talker/cp o 12.6 -> 3.5, cp qkv 5.2 -> 4.4, cp gate_up + silu·mul 7.4 -> 5.9, cp down 6.5 -> 3.9.
# Session 27: at one row the code predictor's qkv, gate/up and heads always take a folded norm
# (``SkinnyLinear.normed``: every program recomputes the row's statistics); at (16, 1024, 1, 8, 1), half
# the programs of (8, 1024, 1, 4, 1) with the same 64 weights a thread, the talker frame step at B=1 took
# 3.28 ms against 3.53 (micro.py, one run each in one call: cpfold call 2's what-if cell).
TUNED: dict[tuple[int, int, int, bool, bool], Blocks | None] = {
    # thinker qkv
    (1, 5120, 2048, False, False): None,
    (16, 5120, 2048, False, False): Blocks(64, 128, 1, 4, 6),
    (32, 5120, 2048, False, False): Blocks(64, 128, 1, 4, 6),
    # thinker o
    (1, 2048, 4096, False, True): Blocks(64, 256, 4, 4, 3, rows=16),
    (16, 2048, 4096, False, True): Blocks(64, 128, 4, 4, 6),
    (32, 2048, 4096, False, True): Blocks(64, 128, 4, 4, 6),
    # talker qkv
    (1, 2560, 1024, False, False): Blocks(8, 1024, 1, 4, 1),
    (16, 2560, 1024, False, False): Blocks(64, 128, 1, 4, 6),
    (32, 2560, 1024, False, False): Blocks(64, 128, 1, 4, 6),
    # talker o, cp o
    (1, 1024, 2048, False, True): Blocks(4, 4096, 1, 8, 1),
    (16, 1024, 2048, False, True): Blocks(64, 128, 4, 4, 6),
    (32, 1024, 2048, False, True): Blocks(64, 128, 4, 4, 6),
    # cp qkv
    (1, 4096, 1024, False, False): Blocks(16, 1024, 1, 8, 1),
    (16, 4096, 1024, False, False): Blocks(64, 128, 1, 4, 6),
    (32, 4096, 1024, False, False): Blocks(64, 128, 1, 4, 6),
    # cp gate_up (I = 3072)
    (1, 3072, 1024, True, False): Blocks(16, 1024, 1, 8, 1),
    (16, 3072, 1024, True, False): Blocks(64, 128, 1, 4, 6),
    (32, 3072, 1024, True, False): Blocks(32, 128, 1, 4, 6),
    # cp down
    (1, 1024, 3072, False, True): Blocks(4, 4096, 1, 8, 1),
    (16, 1024, 3072, False, True): Blocks(64, 128, 4, 4, 6),
    (32, 1024, 3072, False, True): Blocks(64, 128, 4, 4, 6),
    # cp lm_head (vocabulary 2048; session 27): at one row a GEMV with the final norm folded in, the tile
    # of the folded cp qkv (measured in the frame step only); cuBLAS kept for more rows (not measured here)
    (1, 2048, 1024, False, False): Blocks(16, 1024, 1, 8, 1),
    (16, 2048, 1024, False, False): None,
    (32, 2048, 1024, False, False): None,
    # Qwen2.5-Omni-7B's dense decoders (session 31, benchmarks/skinny_gemm.py --shapes qwen2.5-omni-7b, H200;
    # results/2026-12-02-h200-s31 call 1). µs at M = 1, default_blocks -> this table (cuBLAS): thinker qkv
    # 12.3 -> 10.3 (10.7), o 9.0 -> 7.2 (11.6), gate_up 64.7 -> 64.6 (78.4), down 41.1 -> 34.6 (41.7); talker
    # qkv 2.67 -> 2.55, o 2.86 -> 1.79, down 16.8 -> 10.2; talker gate_up's default measured equal to the best
    # (21.76 / 21.75 µs), so it keeps the default (it folds the norm). The split o/down tiles leave the next
    # norm unfolded (a delta of 2-4 parts): the s2t B = 1 engine step measured 4.71 -> 4.37 ms all the same.
    # Qwen2.5-Omni-7B thinker qkv
    (1, 4608, 3584, False, False): Blocks(16, 512, 1, 4, 1),
    (16, 4608, 3584, False, False): None,
    (32, 4608, 3584, False, False): None,
    # Qwen2.5-Omni-7B thinker o
    (1, 3584, 3584, False, True): Blocks(32, 256, 4, 4, 1),
    (16, 3584, 3584, False, True): Blocks(64, 128, 2, 4, 6),
    (32, 3584, 3584, False, True): Blocks(64, 128, 2, 4, 6),
    # Qwen2.5-Omni-7B thinker gate_up (I = 18944)
    (1, 18944, 3584, True, False): Blocks(16, 512, 1, 4, 3),
    (16, 18944, 3584, True, False): Blocks(64, 128, 1, 4, 6),
    (32, 18944, 3584, True, False): None,
    # Qwen2.5-Omni-7B thinker down
    (1, 3584, 18944, False, True): Blocks(64, 256, 2, 4, 3, rows=16),
    (16, 3584, 18944, False, True): Blocks(64, 256, 2, 4, 3),
    (32, 3584, 18944, False, True): Blocks(64, 128, 2, 4, 6),
    # Qwen2.5-Omni-7B talker qkv
    (1, 2560, 896, False, False): Blocks(8, 1024, 1, 4, 1),
    (16, 2560, 896, False, False): Blocks(64, 128, 1, 4, 6),
    (32, 2560, 896, False, False): Blocks(64, 128, 1, 4, 6),
    # Qwen2.5-Omni-7B talker o
    (1, 896, 1536, False, True): Blocks(8, 1024, 2, 4, 1),
    (16, 896, 1536, False, True): Blocks(32, 128, 4, 4, 6),
    (32, 896, 1536, False, True): Blocks(64, 128, 4, 4, 6),
    # Qwen2.5-Omni-7B talker gate_up
    (16, 18944, 896, True, False): Blocks(64, 128, 1, 4, 6),
    (32, 18944, 896, True, False): None,
    # Qwen2.5-Omni-7B talker down
    (1, 896, 18944, False, True): Blocks(4, 4096, 1, 8, 1),
    (16, 896, 18944, False, True): Blocks(64, 128, 4, 4, 6),
    (32, 896, 18944, False, True): Blocks(64, 128, 4, 4, 6),
}


# FP8 weights (the same keys; others use ``TUNED``'s tiles or ``default_blocks``). The GEMV widens each
# weight tile to fp32 as it is loaded (``fp8.triton_widening``) and carries it one step ahead (4 bytes of
# registers a weight). H200, benchmarks/fp8.py projections (fp8w's call, session 26), µs per call at M = 1
# against bf16's pick: thinker qkv (16, 512, 1, 4, 1) 6.15 (bf16 cuBLAS 7.70; (8, 1024, 1, 4, 1) 6.73),
# thinker o (8, 1024, 1, 4, 1) 5.74 (bf16 5.81; (16, 1024, 2, 8, 1) 6.80), cp down (4, 2048, 1, 4, 1) 3.67
# (bf16 2.90; TUNED's (4, 4096, 1, 8, 1) 4.20); TUNED's tiles measured best for talker qkv (2.19, bf16 2.58)
# and cp gate_up (6.54, bf16 5.70). Talker o, cp qkv and cp o take TUNED's (not measured in FP8).
# At 32 rows (session 34 call 3, ``fp8.py --parts tune --tune-rows 32``, µs, against the bf16 tile FP8 took
# before): thinker qkv 13.08 (13.23), thinker o 8.40 (8.66), talker qkv 6.13 (7.33), talker o 4.21 (4.91), cp
# down 5.54 (6.85); cp gate_up keeps TUNED's (32, 128, 1, 4, 6), 12.02.
# micro.py, FP8 at B = 32 with these (``fp8.py --apply``, one run each): talker frame 8.73 -> 7.77 ms, thinker
# step 9.24 -> 8.86; in the source, A/B (call 6): talker 7.29 (one run) -> 6.36 / 6.69 ms.
# Session 36 (the dot path's tile dequantised before a chained dot; calls 1-2, results/2026-12-04-h200-s36), µs at
# 32 rows, the old dot -> the chained dot with the tiles above -> call 2's tune: thinker qkv 13.16 -> 10.47 -> 10.43
# (same tile), thinker o 8.46 -> 6.61 -> 6.57 (same), talker qkv 6.17 -> 5.80 -> 5.43, talker o 4.24 -> 3.58 -> 3.30,
# cp gate_up 12.15 -> 8.91 -> 8.45, cp down 5.56 -> 4.58 -> 4.13 (bf16's picks: 8.35, 5.88, 4.22, 3.33, 7.16, 4.03):
# the talker's and code predictor's shapes now take K steps of 64 in 8 stages. At 16 rows (call 6, the same tune;
# TUNED's bf16 tiles, which 16 rows took before, in brackets): thinker qkv 8.85 (10.21), thinker o 5.46 (6.46), talker
# qkv 4.04 (5.86), talker o 2.88 (3.94), cp gate_up 6.66 (8.98), cp down 3.55 (5.03), all at (32, 128, ., 4, 4).
TUNED_FP8: dict[tuple[int, int, int, bool, bool], Blocks] = {
    (1, 5120, 2048, False, False): Blocks(16, 512, 1, 4, 1),
    (1, 2048, 4096, False, True): Blocks(8, 1024, 1, 4, 1),
    (1, 1024, 3072, False, True): Blocks(4, 2048, 1, 4, 1),
    (16, 5120, 2048, False, False): Blocks(32, 128, 1, 4, 4),
    (16, 2048, 4096, False, True): Blocks(32, 128, 4, 4, 4),
    (16, 2560, 1024, False, False): Blocks(32, 128, 1, 4, 4),
    (16, 1024, 2048, False, True): Blocks(32, 128, 4, 4, 4),
    (16, 3072, 1024, True, False): Blocks(32, 128, 1, 4, 4),
    (16, 1024, 3072, False, True): Blocks(32, 128, 4, 4, 4),
    (32, 5120, 2048, False, False): Blocks(64, 128, 1, 4, 4),
    (32, 2048, 4096, False, True): Blocks(64, 128, 4, 4, 4),
    (32, 2560, 1024, False, False): Blocks(32, 64, 1, 4, 8),
    (32, 1024, 2048, False, True): Blocks(32, 64, 4, 4, 8),
    (32, 3072, 1024, True, False): Blocks(32, 64, 1, 4, 8),
    (32, 1024, 3072, False, True): Blocks(32, 64, 4, 4, 8),
}


def padded_rows(m: int) -> int:
    """1 (a GEMV: no tensor-core dot), else M padded to a power of two >= 16 (``tl.dot``'s minimum)."""
    return 1 if m == 1 else max(16, 1 << (m - 1).bit_length())


@functools.cache
def _kernel():
    """The Triton kernel (``skinny_gemm_triton``: its code, imported on first use)."""
    return importlib.import_module("omniwalk.layers.skinny_gemm_triton").skinny_gemm


def pick_blocks(m: int, n: int, k: int, gated: bool, may_split: bool, fp8: bool = False) -> Blocks | None:
    """The launch configuration of an M x N x K product (N: output columns; I for a gated one):
    ``TUNED``'s (None where cuBLAS measured faster; never for FP8 weights, which cuBLAS would
    read dequantised; ``TUNED_FP8`` first for them), else ``default_blocks``."""
    key = (padded_rows(m), n, k, gated, may_split)
    if fp8 and key in TUNED_FP8:
        return TUNED_FP8[key]
    tuned = TUNED.get(key, default_blocks(m, n, k, may_split, fp8, gated))
    return tuned if tuned is not None or not fp8 else default_blocks(m, n, k, may_split, fp8, gated)


def default_blocks(m: int, n: int, k: int, may_split: bool, fp8: bool = False, gated: bool = False) -> Blocks:
    """Shapes not in ``TUNED``: about one program per SM (132 on the H200) from 16- or 32-column
    blocks, split along K where the columns are too few (an FP8 GEMV: half the K step, 64 weights a thread,
    so its fp32 tile stays in registers: 128 spilled in the sm_90a build, ``benchmarks/fp8_sass.py``).
    A bf16 GEMV thread holds at most 128 weights a step, a gated one's two halves counted: a gated
    32 x 512 tile (256) spilled 2.7 KB of stack a thread (Qwen2.5-Omni-7B's dense gate_up at B=1)."""
    block_n = 32 if n >= 32 * 128 and not (gated and m == 1 and not fp8) else 16
    split = 2 if may_split and -(-n // block_n) < 96 and k >= 2048 else 1
    return Blocks(block_n, 256 if m > 1 or fp8 else 512, split, 4, 4)


class InputNorm(NamedTuple):
    """An RMSNorm folded into a GEMV's prologue (one row): the product's x is RMSNorm(h + delta) with
    ``norm.RMSNorm.add``'s rounding steps, computed by every program from the row (which a GEMV reads
    whole anyway), and h + delta is stored once, by the first program."""

    h: torch.Tensor  # [1, K] the residual stream
    delta: torch.Tensor | None  # None, [1, K] or [1, S, K] parts, as ``norm.RMSNorm.add`` takes them
    weight: torch.Tensor  # [K] the norm's, in h's dtype
    eps: float


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, *, gated: bool = False, partials: bool = False, blocks: Blocks | None = None,
    scale: torch.Tensor | None = None, scale_block: Block | None = None, bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [M, K], weight [N, K] -> x @ weight^T (+ ``bias`` [N]) [M, N] in x's dtype, or with ``gated``
    silu(gate) * up [M, N / 2]. With ``partials`` (and a split > 1) fp32 partial sums [M, S, N] (see the
    module docstring); ``partials`` never splits a gated or biased product. An FP8 ``weight`` comes with
    its ``scale`` (``fp8.py``'s scale_inv grid of ``scale_block``)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    blocks, split = _configuration(x.shape[0], x.shape[1], weight, gated, partials, blocks, scale is not None, bias)
    m, n = x.shape[0], _columns(weight, gated)
    out = x.new_empty(m, split, n, dtype=torch.float32) if split > 1 else x.new_empty(m, n)
    if m:
        _launch(x, weight, out, blocks, split, gated, scale, scale_block, bias)
    return out


def normed_skinny_gemm(
    norm: InputNorm, weight: torch.Tensor, *, gated: bool = False, blocks: Blocks | None = None,
    scale: torch.Tensor | None = None, scale_block: Block | None = None, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``norm.RMSNorm.add`` folded into the GEMV that takes its output: -> (h + delta [1, K], the product
    of RMSNorm(h + delta) as ``skinny_gemm``'s [1, N]), one kernel. One row only, through the GEMV lanes
    (a configuration with ``rows`` > 1 is refused); never split."""
    h = norm.h if norm.h.stride(-1) == 1 else norm.h.contiguous()
    blocks, split = _configuration(h.shape[0], h.shape[1], weight, gated, False, blocks, scale is not None, bias)
    if h.shape[0] != 1 or blocks.rows > 1:
        raise ValueError(f"a folded norm is a GEMV's prologue: one row, unpadded (got {h.shape[0]}, {blocks})")
    out = h.new_empty(1, _columns(weight, gated))
    h_out = h if norm.delta is None else torch.empty_like(h)
    _launch(h, weight, out, blocks, split, gated, scale, scale_block, bias, norm._replace(h=h), h_out)
    return h_out, out


def _columns(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def _configuration(
    m: int, k: int, weight: torch.Tensor, gated: bool, partials: bool, blocks: Blocks | None, fp8: bool,
    bias: torch.Tensor | None = None,
) -> tuple[Blocks, int]:  # fmt: skip
    """The launch configuration (``blocks``, else the pick for the shape) and its split along K."""
    if weight.stride(-1) != 1:
        raise ValueError("skinny_gemm wants a weight with contiguous rows")
    if bias is not None and (gated or bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"a bias is one contiguous [N] vector of an ungated product (got {tuple(bias.shape)})")
    n, may_split = _columns(weight, gated), partials and not gated and bias is None
    blocks = blocks or pick_blocks(m, n, k, gated, may_split, fp8) or default_blocks(m, n, k, may_split, fp8, gated)
    split = 1 if gated else blocks.split
    if split > 1 and not partials:
        raise ValueError("a split product returns partial sums: pass partials=True")
    if split > 1 and bias is not None:
        raise ValueError("a biased product is never split (each partial sum would add the bias)")
    return blocks, split


def _launch(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, blocks: Blocks, split: int, gated: bool,
    scale: torch.Tensor | None, scale_block: Block | None, bias: torch.Tensor | None,
    norm: InputNorm | None = None, h_out: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """The kernel over x [M, K] (with ``norm``: its h) into ``out``."""
    (m, k), n = x.shape, out.shape[-1]
    block_m = blocks.rows or padded_rows(m)
    block_k = blocks.k if scale is None or block_m == 1 else min(blocks.k, scale_block[1])  # (a dot's step: one scale)
    k_chunk = -(-k // (split * block_k)) * block_k  # each split: a whole number of K steps
    scale_n, scale_k = scale_block or (1, 1)
    prologue, prologue_constants = _prologue(norm, x, h_out, k)
    _kernel()[(-(-n // blocks.n), split)](
        x, weight, weight if scale is None else scale, out, m, n, k, k_chunk, x.stride(0), weight.stride(0),
        0 if scale is None else scale.stride(0), out.stride(0), out.stride(1) if split > 1 else 0,
        n * weight.stride(0), 0 if scale is None else n // scale_n * scale.stride(0), *prologue,
        x if bias is None else bias,
        BLOCK_M=block_m, BLOCK_N=blocks.n, BLOCK_K=block_k, GATED=gated, SCALED=scale is not None,
        BIAS=bias is not None, SCALE_N=scale_n, SCALE_K=scale_k, ROWS_SHARE_SCALE=scale_n % blocks.n == 0,
        SUB_K=block_k if scale is None else min(block_k, scale_k), WIDEN_ASM=asm_widening(x.device),
        **prologue_constants,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # (fp32 as F.linear's; 16-bit ignores it)
        num_warps=blocks.warps, num_stages=blocks.stages, **pdl.launch(x.device),
    )  # fmt: skip


def _prologue(norm: InputNorm | None, x: torch.Tensor, h_out: torch.Tensor | None, k: int) -> tuple[tuple, dict]:
    """The kernel's folded-norm operands (h, delta parts [1, S, K], norm weight, h_out, eps, parts' stride;
    x for each pointer without a norm, never read) and constants."""
    if norm is None:
        return (x, x, x, x, 0.0, 0), {"NORM": False, "PARTS": 0, "ROUND_EACH": False, "K_ROW": 1}
    d = None if norm.delta is None else norm.delta.reshape(1, -1, norm.h.shape[-1])
    d = d if d is None or d.stride(-1) == 1 else d.contiguous()
    operands = (norm.h, norm.h if d is None else d, norm.weight, h_out, norm.eps, 0 if d is None else d.stride(1))
    constants = {
        "NORM": True,
        "PARTS": 0 if d is None else d.shape[1],
        "ROUND_EACH": d is not None and d.dtype == norm.h.dtype,
        "K_ROW": 1 << (k - 1).bit_length(),  # (the norm kernel's block)
    }
    return operands, constants


class MergesProjections(nn.Module):
    """A module whose projections the CUDA fast path merges into ``SkinnyLinear``s after the weights are
    loaded (``decoder.use_kernels`` calls ``merge_projections`` on each)."""

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
    fast path: up to ``MAX_ROWS`` rows through ``skinny_gemm``, more through ``F.linear``.

    ``gated``: ``weight`` is a merged gate/up projection and the output is silu(gate) * up.
    ``partials``: the output may be fp32 partial sums [M, S, N] (the module's consumer sums them,
    e.g. the decoder's next ``RMSNorm.add``); only for 2-D inputs.
    ``scale``/``block``: ``weight`` is FP8 with this scale_inv grid (``fp8.py``); the kernel reads
    it as stored, ``F.linear`` (more rows) a dequantised copy (``fp8.dequantize_triton``, one kernel).
    A ``bias`` goes with a plain product only (neither gated nor partial sums).
    """

    def __init__(
        self, weight: torch.Tensor, gated: bool = False, partials: bool = False,
        scale: torch.Tensor | None = None, block: Block | None = None, bias: torch.Tensor | None = None,
    ):  # fmt: skip
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
        a delta of at most ``MAX_FOLDED_PARTS`` parts), else the norm's kernel and then this one."""
        rows, k = h.numel() // h.shape[-1], h.shape[-1]
        n, fp8 = self.weight.shape[0] // 2 if self.gated else self.weight.shape[0], self.weight_scale_inv is not None
        blocks = pick_blocks(rows, n, k, self.gated, False, fp8) if rows == 1 else None
        parts = 0 if delta is None else 1 if delta.dim() == h.dim() else delta.shape[-2]
        if norm.backend != "triton" or blocks is None or blocks.rows > 1 or parts > MAX_FOLDED_PARTS:
            h, x = norm.add(h, delta)
            return h, self(x)
        h_out, y = normed_skinny_gemm(
            InputNorm(h.reshape(1, k), delta, norm.weight, norm.eps), self.weight, gated=self.gated, blocks=blocks,
            scale=self.weight_scale_inv, scale_block=self.block, bias=self.bias,
        )  # fmt: skip
        return h_out.view(h.shape), y.view(*h.shape[:-1], y.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        (n, k), m = self.weight.shape, flat.shape[0]
        partials = self.partials and x.dim() == 2
        n = n // 2 if self.gated else n
        fp8 = self.weight_scale_inv is not None
        may_split = partials and not self.gated
        blocks = pick_blocks(m, n, k, self.gated, may_split, fp8) if m <= MAX_ROWS else None
        if blocks is None:
            w = dequantize_triton(self.weight, self.weight_scale_inv, self.block, x.dtype) if fp8 else self.weight
            y = F.linear(x, w, self.bias)
            return silu_mul_triton(y) if self.gated else y
        y = skinny_gemm(
            flat, self.weight, gated=self.gated, partials=partials, blocks=blocks, scale=self.weight_scale_inv,
            scale_block=self.block, bias=self.bias,
        )  # fmt: skip
        return y if y.dim() == 3 else y.view(*x.shape[:-1], y.shape[-1])
