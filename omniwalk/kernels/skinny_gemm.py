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
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omniwalk.kernels import pdl, tuned
from omniwalk.kernels.fp8 import asm_widening, widen
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


@triton.jit
def load_weights(ptrs, ok, SCALED: tl.constexpr, WIDEN_ASM: tl.constexpr):
    """A weight tile; FP8 widened to fp32 as loaded (``fp8.widen``), bf16 as stored."""
    w = tl.load(ptrs, mask=ok, other=0.0)
    if SCALED:
        w = widen(w) if WIDEN_ASM else w.to(tl.float32)
    return w


@triton.jit
def scale_pointers(
    s_ptr,
    block,
    cols,
    col_ok,
    stride_sn,
    up_scale_offset,
    BLOCK_N: tl.constexpr,
    SCALE_N: tl.constexpr,
    ROWS_SHARE_SCALE: tl.constexpr,
):
    """FP8 weights: scale_inv of weight (n, k) is at s_ptr + (n // SCALE_N) * stride_sn + k // SCALE_K.
    -> (gate scale rows, up scale rows, their mask), each [1 or BLOCK_N, 1]."""
    if ROWS_SHARE_SCALE:  # (every row of the block in one scale row: one scale row broadcast over them)
        scale_rows = tl.zeros((1, 1), tl.int64) + block * BLOCK_N // SCALE_N
        scale_ok = scale_rows >= 0
    else:
        scale_rows = (cols // SCALE_N).to(tl.int64)[:, None]
        scale_ok = col_ok[:, None]
    gate_scales = s_ptr + scale_rows * stride_sn
    return gate_scales, gate_scales + up_scale_offset, scale_ok


@triton.jit
def residual(h_ptr, d_ptr, ks, ok, stride_dk, PARTS: tl.constexpr, ROUND_EACH: tl.constexpr):
    """h + delta at columns ks, rounded as ``add_rms_norm`` rounds it (delta: PARTS parts summed in
    fp32, each sum rounded when ROUND_EACH, the total rounded before the add); fp32 values of h's dtype."""
    dtype = h_ptr.dtype.element_ty
    x = tl.load(h_ptr + ks, mask=ok, other=0.0).to(tl.float32)
    if PARTS > 0:
        acc = tl.zeros_like(x)
        for k in tl.static_range(PARTS):
            acc += tl.load(d_ptr + k * stride_dk + ks, mask=ok, other=0.0).to(tl.float32)
            if ROUND_EACH:
                acc = acc.to(dtype).to(tl.float32)
        x = (x + acc.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    return x


@triton.jit
def row_rstd(
    h_ptr,
    d_ptr,
    h_out_ptr,
    K,
    eps,
    stride_dk,
    writes_residual,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
):
    """The folded norm's prologue, over the whole row (K_ROW: K padded to a power of two, as the norm
    kernel's block): 1 / rms of h + delta, as ``add_rms_norm`` computes it; the program with
    ``writes_residual`` stores h + delta (the decoder's next residual stream)."""
    cols = tl.arange(0, K_ROW)
    ok = cols < K
    x = residual(h_ptr, d_ptr, cols, ok, stride_dk, PARTS, ROUND_EACH)
    if PARTS > 0:
        tl.store(h_out_ptr + cols, x.to(h_ptr.dtype.element_ty), mask=ok & writes_residual)
    return tl.math.rsqrt(tl.sum(x * x, 0) / K + eps)


@triton.jit
def normed(h_ptr, d_ptr, nw_ptr, ks, ok, rstd, stride_dk, PARTS: tl.constexpr, ROUND_EACH: tl.constexpr):
    """RMSNorm(h + delta) at columns ks with the row's ``rstd``: ``add_rms_norm``'s rounding steps
    (normalised value rounded to the dtype, then the weight product); fp32 values of the dtype."""
    dtype = h_ptr.dtype.element_ty
    y = (residual(h_ptr, d_ptr, ks, ok, stride_dk, PARTS, ROUND_EACH) * rstd).to(dtype).to(tl.float32)
    return (tl.load(nw_ptr + ks, mask=ok, other=0.0).to(tl.float32) * y).to(dtype).to(tl.float32)


@triton.jit
def gemv(
    x_ptr,
    gate_rows,
    up_rows,
    gate_scales,
    up_scales,
    scale_ok,
    col_ok,
    k_start,
    k_end,
    h_ptr,
    d_ptr,
    nw_ptr,
    h_out_ptr,
    K,
    eps,
    stride_dk,
    writes_residual,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_K: tl.constexpr,
    SUB_K: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
    NORM: tl.constexpr,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One row (M = 1): fp32 products summed in lanes, reduced once at the end; K steps cut into
    sub-blocks, each inside one scale column. bf16: a lane per weight of the tile, [BLOCK_N, BLOCK_K / SUB_K,
    SUB_K]; FP8: a lane per V = 16 weights (a thread's 16-byte load), [BLOCK_N, BLOCK_K / SUB_K, SUB_K / 16],
    taking each step's sum of 16 products times the sub-block's scale: a tile of fp32 lanes as large as
    the weight tile spilled FP8 tiles of 128 weights a thread, whose widened weights take a register each
    (sm_90a). Each step's weight tile is loaded one step ahead, the first before
    the PDL wait. x is loaded once per step and broadcast over the tile's rows (for FP8 that layout differs
    from the widened tile's and goes through shared memory, which is faster than loading x in the tile's
    own shape). NORM: x is RMSNorm(h + delta), computed here
    (``row_rstd``, ``normed``). -> (gate or plain sums, up sums), each [BLOCK_N, 1]."""
    V: tl.constexpr = 16 if SCALED else 1
    steps = (
        tl.arange(0, BLOCK_K // SUB_K)[None, :, None, None] * SUB_K
        + tl.arange(0, SUB_K // V)[None, None, :, None] * V
        + tl.arange(0, V)[None, None, None, :]
    )
    gate3, up3 = gate_rows[:, :, None, None], up_rows[:, :, None, None]
    lanes = tl.zeros((BLOCK_N, BLOCK_K // SUB_K, SUB_K // V), tl.float32)
    lanes_up = tl.zeros((BLOCK_N, BLOCK_K // SUB_K, SUB_K // V), tl.float32)
    ks = k_start + steps
    ok = col_ok[:, None, None, None] & (ks < k_end)
    w = load_weights(gate3 + ks, ok, SCALED, WIDEN_ASM)
    w_up = load_weights(up3 + ks, ok, SCALED, WIDEN_ASM) if GATED else w
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = 0.0
    if NORM:
        rstd = row_rstd(h_ptr, d_ptr, h_out_ptr, K, eps, stride_dk, writes_residual, PARTS, ROUND_EACH, K_ROW)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + steps
        if NORM:
            x = normed(h_ptr, d_ptr, nw_ptr, ks, ks < k_end, rstd, stride_dk, PARTS, ROUND_EACH)
        else:
            x = tl.load(x_ptr + ks, mask=ks < k_end, other=0.0).to(tl.float32)
        part = tl.sum(w.to(tl.float32) * x, 3)
        part_up = tl.sum(w_up.to(tl.float32) * x, 3) if GATED else part
        if SCALED:  # (a sub-block's partial sums times its scale: one scale column each)
            sub = (k0 + tl.arange(0, BLOCK_K // SUB_K) * SUB_K)[None, :, None]
            sub_ok = scale_ok[:, :, None] & (sub < k_end)
            if GATED:
                part_up = part_up * tl.load(up_scales[:, :, None] + sub // SCALE_K, mask=sub_ok, other=0.0)
            part = part * tl.load(gate_scales[:, :, None] + sub // SCALE_K, mask=sub_ok, other=0.0)
        lanes += part
        if GATED:
            lanes_up += part_up
        ok = col_ok[:, None, None, None] & (ks + BLOCK_K < k_end)
        w = load_weights(gate3 + BLOCK_K + ks, ok, SCALED, WIDEN_ASM)
        if GATED:
            w_up = load_weights(up3 + BLOCK_K + ks, ok, SCALED, WIDEN_ASM)
    return tl.sum(tl.sum(lanes, 2), 1)[:, None], tl.sum(tl.sum(lanes_up, 2), 1)[:, None]


@triton.jit
def dot_tiles(
    x_ptr,
    gate_rows,
    up_rows,
    gate_scales,
    up_scales,
    scale_ok,
    col_ok,
    rows,
    row_ok,
    k_start,
    k_end,
    stride_xm,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_K: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Several rows: ``tl.dot`` of each weight tile [BLOCK_N, BLOCK_K] with x^T [BLOCK_K, BLOCK_M] (FP8: the
    tile dequantised to x's dtype first, ``fp8.dequantize``'s values: the K step is inside one scale column).
    -> (gate or plain sums, up sums), each [BLOCK_N, BLOCK_M]."""
    if USE_PDL:  # (tl.dot's loads are pipelined by the compiler: no weight tile before the wait)
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + ks[:, None], mask=row_ok[None, :] & k_ok[:, None], other=0.0)
        ok = col_ok[:, None] & k_ok[None, :]
        w = tl.load(gate_rows + ks[None, :], mask=ok, other=0.0)
        w_up = tl.load(up_rows + ks[None, :], mask=ok, other=0.0) if GATED else w
        if not SCALED:
            acc = tl.dot(w, xt, acc, input_precision=PRECISION)
            if GATED:
                acc_up = tl.dot(w_up, xt, acc_up, input_precision=PRECISION)
        else:  # (the tile dequantised as ``fp8.dequantize`` does: product in fp32, rounded once to x's dtype)
            s = tl.load(gate_scales + k0 // SCALE_K, mask=scale_ok, other=0.0)
            acc = tl.dot((w.to(tl.float32) * s).to(xt.dtype), xt, acc, input_precision=PRECISION)
            if GATED:
                s_up = tl.load(up_scales + k0 // SCALE_K, mask=scale_ok, other=0.0)
                acc_up = tl.dot((w_up.to(tl.float32) * s_up).to(xt.dtype), xt, acc_up, input_precision=PRECISION)
    return acc, acc_up


@triton.jit
def store_output(acc, acc_up, out, ok, b_ptr, cols, bias_ok, GATED: tl.constexpr, BIAS: tl.constexpr):
    """Round the fp32 sums once to the output's dtype (BIAS: the bias added first where ``bias_ok``, as a
    biased Linear's epilogue adds it); GATED: silu(gate) * up, rounded like ``silu_mul``'s reference (gate
    and up rounded as a GEMM's outputs are, silu rounded, then the product)."""
    dtype = out.dtype.element_ty
    if BIAS:
        acc += tl.load(b_ptr + cols, mask=bias_ok, other=0.0).to(tl.float32)[:, None]
    if GATED:
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = silu * acc_up.to(dtype).to(tl.float32)
    tl.store(out, acc.to(dtype), mask=ok)


@triton.jit(do_not_specialize=["M"])  # (M only masks rows: one compile for every M of a padding)
def skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    k_chunk,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    stride_os,
    up_offset,
    up_scale_offset,
    h_ptr,
    d_ptr,
    nw_ptr,
    h_out_ptr,
    eps,
    stride_dk,
    b_ptr,
    e_ptr,
    e_out_ptr,
    N_E,
    stride_eom,
    stride_eos,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED: tl.constexpr,
    BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    ROWS_SHARE_SCALE: tl.constexpr,
    SUB_K: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
    NORM: tl.constexpr,
    PARTS: tl.constexpr,
    ROUND_EACH: tl.constexpr,
    K_ROW: tl.constexpr,
    EXTRA: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """A program: BLOCK_N weight rows (output columns) x one K range (``split``) x all M rows. EXTRA: the
    programs past W's column blocks take the extra rows (``e_ptr`` [N_E, K]) into their own output."""
    block, split = tl.program_id(0), tl.program_id(1)
    writes_residual = (block == 0) & (split == 0)
    in_w = True
    if EXTRA:
        w_blocks = tl.cdiv(N, BLOCK_N)
        in_w = block < w_blocks
        if block >= w_blocks:
            block -= w_blocks
            w_ptr, out_ptr, N, stride_om, stride_os = e_ptr, e_out_ptr, N_E, stride_eom, stride_eos
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns = weight rows
    col_ok = cols < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k_start = split * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    gate_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + up_offset  # (GATED only: the up half starts I rows further)
    gate_scales, up_scales, scale_ok = scale_pointers(
        s_ptr, block, cols, col_ok, stride_sn, up_scale_offset, BLOCK_N, SCALE_N, ROWS_SHARE_SCALE
    )
    if BLOCK_M == 1:
        acc, acc_up = gemv(
            x_ptr,
            gate_rows,
            up_rows,
            gate_scales,
            up_scales,
            scale_ok,
            col_ok,
            k_start,
            k_end,
            h_ptr,
            d_ptr,
            nw_ptr,
            h_out_ptr,
            K,
            eps,
            stride_dk,
            writes_residual,
            BLOCK_N,
            BLOCK_K,
            GATED,
            SCALED,
            SCALE_K,
            SUB_K,
            WIDEN_ASM,
            NORM,
            PARTS,
            ROUND_EACH,
            K_ROW,
            USE_PDL,
        )
    else:
        acc, acc_up = dot_tiles(
            x_ptr,
            gate_rows,
            up_rows,
            gate_scales,
            up_scales,
            scale_ok,
            col_ok,
            rows,
            row_ok,
            k_start,
            k_end,
            stride_xm,
            BLOCK_N,
            BLOCK_M,
            BLOCK_K,
            GATED,
            SCALED,
            SCALE_K,
            PRECISION,
            USE_PDL,
        )
    out = out_ptr + split * stride_os + rows[None, :] * stride_om + cols[:, None]
    store_output(acc, acc_up, out, col_ok[:, None] & row_ok[None, :], b_ptr, cols, col_ok & in_w, GATED, BIAS)
