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
instead of x and computes x = RMSNorm(h + delta) itself, with ``add_rms_norm``'s rounding steps:
each program reads the whole row for its 1 / rms (a GEMV reads it anyway), then normalises its K range
as it goes; the first program stores h + delta. ``SkinnyLinear.normed`` uses it where it fits (the code
predictor's one-token passes), replacing the norm's kernel.

FP8 weights (``SCALED``; ``layers/fp8.py``'s block-wise format): the GEMV sums x times the e4m3 weights
widened to fp32 16 at a time and multiplies each sum by its K block's scale (a K step is cut into
sub-blocks inside one scale column; the tile is widened as loaded, one step ahead, with ``fp8.widen``).
Summing 16 products before the lane, not keeping a lane per weight, keeps a tile of 128 weights a
thread in registers. The ``tl.dot`` path dequantises each weight tile as ``fp8.dequantize`` does
(weight times scale in fp32, rounded once to x's dtype: its K step inside one scale column) and
accumulates through chained dots, so its products are those of the bf16 model of the dequantised
weights up to summation order. x stays in its dtype (the GEMVs are bound by the weight bytes in
flight, not by arithmetic).

Launch configurations: ``pick_blocks`` reads the tuned tiles of the device (``tuned.py``: the files
``configs/skinny_gemm,device_name=<GPU>.json`` and ``skinny_gemm_fp8,...`` written by
``benchmarks/kernels/skinny_gemm.py --tune``), keyed by shape; "cublas" there means cuBLAS measured
faster for that shape (``SkinnyLinear`` then calls ``F.linear``); other shapes get ``default_blocks``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from omniwalk.kernels import pdl, tuned
from omniwalk.kernels.fp8 import asm_widening
from omniwalk.kernels.skinny_gemm_kernel import skinny_gemm_kernel
from omniwalk.layers.fp8 import Block

MAX_ROWS = 32  # rows per call through the kernel (where the tuned tiles do not name cuBLAS); cuBLAS beyond
# A folded norm (``SkinnyLinear.normed``) re-reads the row's delta in every program: the dense decoder's one
# part, not the MoE's 8-10 (left to the norm's kernel); more parts cost the folded GEMV more than they save.
MAX_FOLDED_PARTS = 1
CUBLAS = "cublas"  # a tuned entry: cuBLAS is faster for this shape


class Blocks(NamedTuple):
    """One launch configuration. ``split``: programs along K per column block (> 1 only where the
    caller takes partial sums); ``rows``: x's rows padded to (0: ``padded_rows``)."""

    n: int  # weight rows per program
    k: int  # K step per loop iteration
    split: int
    warps: int
    stages: int
    rows: int = 0


def padded_rows(m: int) -> int:
    """1 (a GEMV: no tensor-core dot), else M padded to a power of two >= 16 (``tl.dot``'s minimum)."""
    return 1 if m == 1 else max(16, 1 << (m - 1).bit_length())


def _key(rows: int, n: int, k: int, gated: bool, may_split: bool) -> str:
    return f"rows={rows},N={n},K={k},gated={int(gated)},may_split={int(may_split)}"


def _entry(value) -> Blocks | str:
    return value if value == CUBLAS else Blocks(**value)


@functools.cache
def tuned_blocks(kernel: str, device: tuned.Device) -> dict[str, Blocks | str]:
    """``kernel``'s ("skinny_gemm", "skinny_gemm_fp8") tuned entries for ``device`` (``tuned.configs``), read once."""
    return {key: _entry(value) for key, value in tuned.configs(kernel, device).items()}


def pick_blocks(m: int, n: int, k: int, gated: bool, may_split: bool, fp8: bool = False, device=None) -> Blocks | None:
    """The launch configuration of an M x N x K product (N: output columns; I for a gated one) on
    ``device`` (None: the current CUDA device): the tuned tile (FP8 weights: ``skinny_gemm_fp8``'s
    first, then ``skinny_gemm``'s), None where the bf16 entry is "cublas" (never for FP8 weights,
    which cuBLAS would read dequantised), else ``default_blocks``."""
    key, device = _key(padded_rows(m), n, k, gated, may_split), tuned.device_of(device)
    if fp8 and (tile := tuned_blocks("skinny_gemm_fp8", device).get(key)) is not None:
        return tile
    tile = tuned_blocks("skinny_gemm", device).get(key)
    if tile is None or (tile == CUBLAS and fp8):
        return default_blocks(m, n, k, may_split, fp8, gated)
    return None if tile == CUBLAS else tile


def default_blocks(m: int, n: int, k: int, may_split: bool, fp8: bool = False, gated: bool = False) -> Blocks:
    """Shapes without a tuned tile (and every shape on a device without tuned tiles): about one program
    per SM of a Hopper GPU from 16- or 32-column blocks, split along K where the columns are too few (an
    FP8 GEMV: half the K step, 64 weights a thread, so its fp32 tile stays in registers; 128 spill in the
    sm_90a build, ``tests/kernels/test_gemv_spills.py``). A bf16 GEMV thread holds at most 128 weights a
    step, a gated one's two halves counted (a gated 32 x 512 tile, 256, spills to the stack)."""
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
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    gated: bool = False,
    partials: bool = False,
    blocks: Blocks | None = None,
    scale: torch.Tensor | None = None,
    scale_block: Block | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K], weight [N, K] -> x @ weight^T (+ ``bias`` [N]) [M, N] in x's dtype, or with ``gated``
    silu(gate) * up [M, N / 2]. With ``partials`` (and a split > 1) fp32 partial sums [M, S, N] (see the
    module docstring); ``partials`` never splits a gated or biased product. An FP8 ``weight`` comes with
    its ``scale`` (``layers/fp8.py``'s scale_inv grid of ``scale_block``)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    blocks, split = _configuration(x.shape[0], x.shape[1], weight, gated, partials, blocks, scale is not None, bias)
    m, n = x.shape[0], _columns(weight, gated)
    out = x.new_empty(m, split, n, dtype=torch.float32) if split > 1 else x.new_empty(m, n)
    if m:
        _launch(x, weight, out, blocks, split, gated, scale, scale_block, bias)
    return out


def skinny_gemm_with_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    rows: torch.Tensor,
    *,
    partials: bool = False,
    blocks: Blocks | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``skinny_gemm(x, weight, ...)`` and, in the same launch, x @ rows^T without the bias: more weight
    rows (``rows`` [E, K], weight's dtype) read by more programs of the kernel, with ``weight``'s tiles ->
    (the product as ``skinny_gemm``'s, the rows' product [M, E], or its fp32 partial sums [M, S, E] when the
    product is split). A 16-bit or fp32 ungated product only (a LoRA pool's A rows: ``SkinnyLinear.with_rows``)."""
    if rows.dtype != weight.dtype or rows.dim() != 2 or rows.shape[1] != weight.shape[1] or rows.stride(1) != 1:
        raise ValueError(f"extra rows are [E, K] rows of the weight's dtype (got {tuple(rows.shape)}, {rows.dtype})")
    if rows.shape[0] < 2 or weight.dtype == torch.float8_e4m3fn:
        raise ValueError("extra rows go with a plain 16-bit or fp32 weight, at least two of them")
    x = x if x.stride(-1) == 1 else x.contiguous()
    blocks, split = _configuration(x.shape[0], x.shape[1], weight, False, partials, blocks, False, bias)
    m, n, e = x.shape[0], weight.shape[0], rows.shape[0]
    out = x.new_empty(m, split, n, dtype=torch.float32) if split > 1 else x.new_empty(m, n)
    rows_out = x.new_empty(m, split, e, dtype=torch.float32) if split > 1 else x.new_empty(m, e)
    if m:
        _launch(x, weight, out, blocks, split, False, None, None, bias, extra=(rows, rows_out))
    return out, rows_out


def normed_skinny_gemm(
    norm: InputNorm,
    weight: torch.Tensor,
    *,
    gated: bool = False,
    blocks: Blocks | None = None,
    scale: torch.Tensor | None = None,
    scale_block: Block | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    m: int,
    k: int,
    weight: torch.Tensor,
    gated: bool,
    partials: bool,
    blocks: Blocks | None,
    fp8: bool,
    bias: torch.Tensor | None = None,
) -> tuple[Blocks, int]:
    """The launch configuration (``blocks``, else the pick for the shape) and its split along K."""
    if weight.stride(-1) != 1:
        raise ValueError("skinny_gemm wants a weight with contiguous rows")
    if bias is not None and (gated or bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"a bias is one contiguous [N] vector of an ungated product (got {tuple(bias.shape)})")
    n, may_split = _columns(weight, gated), partials and not gated and bias is None
    blocks = (
        blocks
        or pick_blocks(m, n, k, gated, may_split, fp8, weight.device)
        or default_blocks(m, n, k, may_split, fp8, gated)
    )
    split = 1 if gated else blocks.split
    if split > 1 and not partials:
        raise ValueError("a split product returns partial sums: pass partials=True")
    if split > 1 and bias is not None:
        raise ValueError("a biased product is never split (each partial sum would add the bias)")
    return blocks, split


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    blocks: Blocks,
    split: int,
    gated: bool,
    scale: torch.Tensor | None,
    scale_block: Block | None,
    bias: torch.Tensor | None,
    norm: InputNorm | None = None,
    h_out: torch.Tensor | None = None,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """The kernel over x [M, K] (with ``norm``: its h) into ``out``; ``extra``: (more weight rows, their output)."""
    (m, k), n = x.shape, out.shape[-1]
    rows, rows_out = extra if extra is not None else (weight, out)
    n_e = rows.shape[0] if extra is not None else 0
    block_m = blocks.rows or padded_rows(m)
    block_k = blocks.k if scale is None or block_m == 1 else min(blocks.k, scale_block[1])  # (a dot's step: one scale)
    k_chunk = -(-k // (split * block_k)) * block_k  # each split: a whole number of K steps
    scale_n, scale_k = scale_block or (1, 1)
    prologue, prologue_constants = _prologue(norm, x, h_out, k)
    skinny_gemm_kernel[(-(-n // blocks.n) - (-n_e // blocks.n), split)](
        x,
        weight,
        weight if scale is None else scale,
        out,
        m,
        n,
        k,
        k_chunk,
        x.stride(0),
        weight.stride(0),
        0 if scale is None else scale.stride(0),
        out.stride(0),
        out.stride(1) if split > 1 else 0,
        n * weight.stride(0),
        0 if scale is None else n // scale_n * scale.stride(0),
        *prologue,
        x if bias is None else bias,
        rows,
        rows_out,
        n_e,
        rows_out.stride(0),
        rows_out.stride(1) if split > 1 else 0,
        BLOCK_M=block_m,
        BLOCK_N=blocks.n,
        BLOCK_K=block_k,
        GATED=gated,
        SCALED=scale is not None,
        BIAS=bias is not None,
        SCALE_N=scale_n,
        SCALE_K=scale_k,
        ROWS_SHARE_SCALE=scale_n % blocks.n == 0,
        SUB_K=block_k if scale is None else min(block_k, scale_k),
        WIDEN_ASM=asm_widening(x.device),
        **prologue_constants,
        EXTRA=extra is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # (fp32 as F.linear's; 16-bit ignores it)
        num_warps=blocks.warps,
        num_stages=blocks.stages,
        **pdl.launch(x.device),
    )


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
