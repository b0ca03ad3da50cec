"""The code predictor's frame in one launch: a persistent kernel that runs a schedule of tiles.

A talker frame draws codec groups 1..G-1 with G-1 passes of the code predictor (a small dense
decoder: 5 layers at full size), each pass a chain of small dependent steps; launched one kernel
a step, a frame is ~760 kernels whose launch, ramp and tail cost far more than their bytes. Here
one launch walks the whole frame. The work is a **schedule** (``persistent_schedule.Schedule``, built
on the host for a batch size): steps, each one op over a number of tiles (``OPS``):

    QKV      columns of the merged q/k/v projection of the input-normed residual rows
    ATTN     (request, kv head): q/k norm + rope, K/V stored at the pass's positions, attention
    OUT      a share of the output projection's inputs times a block of its columns: a partial sum
    GATE_UP  columns of the gated MLP's input projection (of the post-attention norm): silu(gate) * up
    DOWN     as OUT, for the MLP's output projection
    HEAD     columns of the group's head over the final norm of each request's last token row
    SAMPLE   a request: its code drawn (``kernels/sampling.py``'s steps), its embedding the next input

The frame's tiles are one sequence; the kernel's programs claim them in order from one counter (a
program takes its next ticket as it starts a tile, and asks that tile's weights into L2 then). A
tile's projection is 32 output columns wide (16 where head_dim is not a multiple of 32), so that a
step at full size is about one tile a program. A tile loads its weights, then waits for the
counters of the earlier step it reads (``Schedule.waits``: e.g. an attention tile for the QKV tiles of
its kv head's columns, a DOWN tile for the GATE_UP tiles of its inputs), runs, and counts itself in a
counter of its own step (``Schedule.signals``, a release); the waits are acquires. No barrier between
steps: a tile starts as soon as what it reads is written, and its weights' loads are in flight while it
waits. A tile waits only for tiles numbered before it, all claimed by running programs, so the kernel
finishes even where not all its programs fit on the GPU at once (another stream's kernels): a program
that starts late claims the next tile. The residual stream is one buffer: OUT's and DOWN's tiles count
the parts of each column block they write, and the tile that counts a block's last part adds them all
to the residual's block and counts the block reduced. ``Schedule.check`` proves from each tile's
declared reads and writes that the waits order every access as the frame run step by step would.
Activations written inside the kernel are read with ``.cg`` loads (past the SM's L1, which other SMs'
writes do not update).

Rounding follows the PyTorch reference (``networks/talker.CodePredictor`` on the reference decoder
kernels): every value the reference holds in the model dtype is rounded to it here at the same step
(the residual stream, norms, projections, rope's products, attention's output, silu and its product,
logits, the running sum of embeddings); sums inside a step are fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniwalk.kernels.persistent_schedule import (
    ATTN,
    COLUMNS,
    DONE,
    DOWN,
    GATE_UP,
    HEAD,
    NORM_K,
    OUT,
    QKV,
    ROWS,
    SAMPLE,
    Schedule,
    Shape,
)
from omniwalk.kernels.sampling import pick

# (the kernel's copies of the schedule's constants)
_QKV, _ATTN, _OUT, _GATE_UP, _DOWN, _HEAD, _SAMPLE = (
    tl.constexpr(v) for v in (QKV, ATTN, OUT, GATE_UP, DOWN, HEAD, SAMPLE)
)
_COLUMNS, _ROWS, _DONE = tl.constexpr(COLUMNS), tl.constexpr(ROWS), tl.constexpr(DONE)
_NORM_K = tl.constexpr(NORM_K)


@triton.jit
def _weights(w_ptr, n0, N: tl.constexpr, K: tl.constexpr, k0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns n0.. of w [N, K] over inputs k0 .. k0 + BLOCK_K: a tile [BLOCK_N, BLOCK_K] (loaded before the
    tile waits: weights depend on nothing the kernel writes)."""
    nn = n0 + tl.arange(0, BLOCK_N)
    ks = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + nn[:, None] * K + ks[None, :], mask=(nn < N)[:, None] & (ks < K)[None, :], other=0.0)


@triton.jit
def _normed_product(
    h_ptr,
    row_of,
    rows_ok,
    eps,
    norm_ptr,
    w_ptr,
    w2_ptr,
    n0,
    N: tl.constexpr,
    HIDDEN: tl.constexpr,
    TWO: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """The residual rows ``row_of`` RMS-normed (fp32 statistics, rounded as ``RMSNorm`` rounds) times columns
    n0.. of w [N, HIDDEN] (and of w2, ``TWO``) -> fp32 [ROWS, BLOCK_N] (two), over NORM_K inputs at a time
    (the rows read twice: for their statistics, then for the product)."""
    dt = w_ptr.dtype.element_ty
    kk = tl.arange(0, _NORM_K)
    squares = tl.zeros([_ROWS], dtype=tl.float32)
    for k0 in tl.static_range(0, BLOCK_H, _NORM_K):
        ks = k0 + kk
        x_mask = rows_ok[:, None] & (ks < HIDDEN)[None, :]
        x = tl.load(h_ptr + row_of[:, None] * HIDDEN + ks[None, :], mask=x_mask, other=0.0, cache_modifier=".cg")
        x = x.to(tl.float32)
        squares += tl.sum(x * x, 1)
    rstd = tl.rsqrt(squares / HIDDEN + eps)
    nn = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros([_ROWS, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([_ROWS, BLOCK_N], dtype=tl.float32)
    for k0 in tl.static_range(0, BLOCK_H, _NORM_K):
        ks = k0 + kk
        k_ok = ks < HIDDEN
        w_at = nn[:, None] * HIDDEN + ks[None, :]
        w_mask = (nn < N)[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + w_at, mask=w_mask, other=0.0)
        x_mask = rows_ok[:, None] & k_ok[None, :]
        x = tl.load(h_ptr + row_of[:, None] * HIDDEN + ks[None, :], mask=x_mask, other=0.0, cache_modifier=".cg")
        normed = (x.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)
        x = (tl.load(norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :] * normed).to(dt)
        acc = tl.dot(x, tl.trans(w), acc)
        if TWO:
            acc2 = tl.dot(x, tl.trans(tl.load(w2_ptr + w_at, mask=w_mask, other=0.0)), acc2)
    return acc, acc2


@triton.jit
def _prefetch(w_ptr, n0, N: tl.constexpr, K: tl.constexpr, k0, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """Rows n0 .. n0 + BLOCK_N of w [N, K], columns k0 .. k0 + WIDTH, asked into L2 one 128-byte line a
    thread at a time (``prefetch.global.L2``: nothing waits for it)."""
    size: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    per_row: tl.constexpr = WIDTH * size // 128
    i = tl.arange(0, BLOCK_N * per_row)
    offsets = (n0 + i // per_row) * K + k0 + (i % per_row) * (128 // size)
    ok = ((n0 + i // per_row) < N).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r",
        [w_ptr + offsets, ok],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_tile(
    op,
    tile,
    layer,
    group,
    weights,
    HIDDEN: tl.constexpr,
    QKV_WIDTH: tl.constexpr,
    ATTN_WIDTH: tl.constexpr,
    INTERMEDIATE: tl.constexpr,
    VOCAB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ON: tl.constexpr,
):
    """A tile's weights asked into L2 (``ON``: not in Triton's interpreter, which has no PTX): a program asks
    for its next tile's as it starts one, so that they are near when that tile starts. ``weights``: the
    q/k/v, output, gate/up, down and heads' pointers."""
    qkv_w_ptr, o_w_ptr, gate_up_w_ptr, down_w_ptr, heads_ptr = weights
    if ON:
        n0 = tile * BLOCK_N
        blocks: tl.constexpr = (HIDDEN + BLOCK_N - 1) // BLOCK_N  # (OUT, DOWN: a split's column blocks)
        if op == _QKV:
            _prefetch(qkv_w_ptr + layer * QKV_WIDTH * HIDDEN, n0, QKV_WIDTH, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _GATE_UP:
            w_gate = gate_up_w_ptr + layer * 2 * INTERMEDIATE * HIDDEN
            _prefetch(w_gate, n0, INTERMEDIATE, HIDDEN, 0, BLOCK_N, HIDDEN)
            _prefetch(w_gate + INTERMEDIATE * HIDDEN, n0, INTERMEDIATE, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _HEAD:
            _prefetch(heads_ptr + group * VOCAB * HIDDEN, n0, VOCAB, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _OUT:
            split, column = tile // blocks, tile % blocks
            w_o = o_w_ptr + layer * HIDDEN * ATTN_WIDTH
            _prefetch(w_o, column * BLOCK_N, HIDDEN, ATTN_WIDTH, split * BLOCK_K, BLOCK_N, BLOCK_K)
        elif op == _DOWN:
            split, column = tile // blocks, tile % blocks
            w_down = down_w_ptr + layer * HIDDEN * INTERMEDIATE
            _prefetch(w_down, column * BLOCK_N, HIDDEN, INTERMEDIATE, split * BLOCK_K, BLOCK_N, BLOCK_K)


@triton.jit
def _reduce(h_ptr, part_ptr, column, rows_ok, SPLITS: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_N: tl.constexpr):
    """The residual's column block ``column`` plus every split's partial sum of it (summed in fp32 in split
    order and rounded once, as the unsplit product), rounded as ``residual_add``; in place."""
    dt = h_ptr.dtype.element_ty
    r = tl.arange(0, _ROWS)
    ks = column * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows_ok[:, None] & (ks < HIDDEN)[None, :]
    at = r[:, None] * HIDDEN + ks[None, :]
    total = tl.zeros([_ROWS, BLOCK_N], dtype=tl.float32)
    for k in tl.static_range(SPLITS):
        total += tl.load(part_ptr + k * _ROWS * HIDDEN + at, mask=mask, other=0.0, cache_modifier=".cg")
    x = tl.load(h_ptr + at, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(h_ptr + at, (x.to(tl.float32) + total.to(dt).to(tl.float32)).to(dt), mask=mask)


@triton.jit
def _wait(counter_ptr, count, unmet_ptr, trace_ptr, SPIN: tl.constexpr, TRACE: tl.constexpr):
    """Until the counter reaches ``count`` (acquire loads: what was counted is then visible). Not ``SPIN``
    (Triton's interpreter: one program, running the tiles in order): a wait not met when reached never
    would be; it is counted in ``unmet`` instead of spun on. ``TRACE``: the time the wait ended, at
    ``trace_ptr``."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    if SPIN:
        while seen < count:
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    elif seen < count:
        tl.atomic_add(unmet_ptr, 1)
    tl.debug_barrier()  # (every thread's loads after the wait)
    _stamp(trace_ptr, TRACE)


@triton.jit
def _stamp(at_ptr, TRACE: tl.constexpr):
    """``TRACE`` (a benchmark's timeline of the frame, ``PersistentCodePredictor.trace``): the GPU's global
    timer (ns) at ``at_ptr``."""
    if TRACE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(at_ptr, now)


@triton.jit
def _signal(counter_ptr):
    tl.debug_barrier()  # (every thread's stores issued before the count says they are done)
    tl.atomic_add(counter_ptr, 1, sem="release")


@triton.jit
def _row(table_ptr, step):
    """Step ``step``'s row of the table: op, tiles, layer, group, position, first tile, producer, need."""
    entry = table_ptr + step * _COLUMNS
    return (
        tl.load(entry),
        tl.load(entry + 1),
        tl.load(entry + 2),
        tl.load(entry + 3),
        tl.load(entry + 4),
        tl.load(entry + 5),
        tl.load(entry + 6),
        tl.load(entry + 7),
    )


@triton.jit
def _head_rope(base, d, dr, rstd, norm_ptr, cos, sin, dt):
    """One head's (or heads' [n, D]) q/k norm then rope at the loaded cos/sin, rounded as the reference
    (``_head_norm``, then ``apply_rotary``'s two products and their sum)."""
    x = tl.load(base + d, cache_modifier=".cg").to(tl.float32)
    xr = tl.load(base + dr, cache_modifier=".cg").to(tl.float32)
    x = (tl.load(norm_ptr + d).to(tl.float32) * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    xr = (tl.load(norm_ptr + dr).to(tl.float32) * (xr * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return ((x * cos).to(dt).to(tl.float32) + (xr * sin).to(dt).to(tl.float32)).to(dt)


@triton.jit
def _attend(
    qkv_ptr,
    attn_ptr,
    keys_ptr,
    values_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cos_ptr,
    sin_ptr,
    tile,
    layer,
    position,
    tokens,
    batch,
    eps,
    scale,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAPACITY: tl.constexpr,
):
    """ATTN tile (request b, kv head j), for each of the pass's tokens in order: k normed, roped and
    stored with v at its position, then its q heads' attention over positions 0..its own."""
    dt = qkv_ptr.dtype.element_ty
    group: tl.constexpr = HEADS // KV_HEADS
    width: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    b = tile // KV_HEADS
    j = tile % KV_HEADS
    d = tl.arange(0, HEAD_DIM)
    dr = (d + HEAD_DIM // 2) % HEAD_DIM
    q_heads = j * group + tl.arange(0, group)
    slots = tl.arange(0, CAPACITY)
    cache = ((layer * batch + b) * CAPACITY + slots[:, None]) * KV_HEADS * HEAD_DIM + j * HEAD_DIM + d[None, :]
    for i in range(tokens):
        pos = position - tokens + 1 + i
        row = b * tokens + i
        base = qkv_ptr + row * width
        cos = tl.load(cos_ptr + pos * HEAD_DIM + d).to(tl.float32)
        sin = tl.load(sin_ptr + pos * HEAD_DIM + d).to(tl.float32)
        k_base = base + (HEADS + j) * HEAD_DIM
        kx = tl.load(k_base + d, cache_modifier=".cg").to(tl.float32)
        k = _head_rope(k_base, d, dr, tl.rsqrt(tl.sum(kx * kx, 0) / HEAD_DIM + eps), k_norm_ptr, cos, sin, dt)
        v = tl.load(base + (HEADS + KV_HEADS + j) * HEAD_DIM + d, cache_modifier=".cg")
        at = ((layer * batch + b) * CAPACITY + pos) * KV_HEADS * HEAD_DIM + j * HEAD_DIM + d
        tl.store(keys_ptr + at, k)
        tl.store(values_ptr + at, v)
        tl.debug_barrier()  # (the program's own stores, read back below by its other threads)
        q_at = q_heads[:, None] * HEAD_DIM
        qx = tl.load(base + q_at + d[None, :], cache_modifier=".cg").to(tl.float32)
        q_rstd = tl.rsqrt(tl.sum(qx * qx, 1) / HEAD_DIM + eps)[:, None]
        q = _head_rope(base + q_at, d[None, :], dr[None, :], q_rstd, q_norm_ptr, cos[None, :], sin[None, :], dt)
        seen = slots <= pos
        keys = tl.load(keys_ptr + cache, mask=seen[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        values = tl.load(values_ptr + cache, mask=seen[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        scores = tl.sum(q.to(tl.float32)[:, None, :] * keys[None, :, :], 2) * scale
        scores = tl.where(seen[None, :], scores, float("-inf"))
        e = tl.exp(scores - tl.max(scores, 1)[:, None])
        out = tl.sum(e[:, :, None] * values[None, :, :], 1) / tl.sum(e, 1)[:, None]
        tl.store(attn_ptr + row * HEADS * HEAD_DIM + q_at + d[None, :], out.to(dt))


@triton.jit(do_not_specialize=["num_tiles", "batch", "flags"])
def code_predictor_frame(
    table_ptr,
    num_steps,
    num_tiles,
    counters_ptr,
    in_norm_ptr,
    qkv_w_ptr,
    q_norm_ptr,
    k_norm_ptr,
    o_w_ptr,
    post_norm_ptr,
    gate_up_w_ptr,
    down_w_ptr,
    final_norm_ptr,
    heads_ptr,
    embeds_ptr,
    cos_ptr,
    sin_ptr,
    h_ptr,
    part_ptr,
    qkv_ptr,
    attn_ptr,
    act_ptr,
    keys_ptr,
    values_ptr,
    logits_ptr,
    codes_ptr,
    total_ptr,
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
    trace_ptr,
    flags,
    batch,
    eps,
    scale,
    HIDDEN: tl.constexpr,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INTERMEDIATE: tl.constexpr,
    VOCAB: tl.constexpr,
    GROUPS: tl.constexpr,
    CAPACITY: tl.constexpr,
    COUNTERS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CANDIDATES: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPIN: tl.constexpr,
    TRACE: tl.constexpr,
):
    dt = qkv_w_ptr.dtype.element_ty
    group_heads: tl.constexpr = HEADS // KV_HEADS
    qkv_width: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    attn_width: tl.constexpr = HEADS * HEAD_DIM
    hidden_blocks: tl.constexpr = (HIDDEN + BLOCK_N - 1) // BLOCK_N
    out_splits: tl.constexpr = (attn_width + BLOCK_K - 1) // BLOCK_K
    down_splits: tl.constexpr = (INTERMEDIATE + BLOCK_K - 1) // BLOCK_K
    gate_up_tiles: tl.constexpr = (INTERMEDIATE + BLOCK_N - 1) // BLOCK_N
    split_tiles: tl.constexpr = BLOCK_K // BLOCK_N  # GATE_UP tiles whose columns are one DOWN split's inputs
    qkv_group_tiles: tl.constexpr = (group_heads + 2) * HEAD_DIM // BLOCK_N  # QKV tiles of one kv head
    part_size: tl.constexpr = _ROWS * HIDDEN  # (one split's partial sums)
    sampling = (temperature_ptr, penalty_ptr, seen_ptr, seen_stride, banned_ptr, banned_stride, allowed_ptr)
    sampling += (allowed_stride, top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr)  # (``sampling.pick``'s)
    r = tl.arange(0, _ROWS)
    nn = tl.arange(0, BLOCK_N)
    claim = counters_ptr + num_steps * COUNTERS  # the frame's tiles, claimed in order
    unmet = claim + 1  # (waits not met where they cannot be: ``_wait``)
    ticket = tl.atomic_add(claim, 1, sem="relaxed")
    step = 0
    op, tiles, layer, group, position, first, producer, need = _row(table_ptr, 0)
    weights = (qkv_w_ptr, o_w_ptr, gate_up_w_ptr, down_w_ptr, heads_ptr)
    if ticket < tiles:  # (the program's first tile: those after it are asked for one tile ahead)
        _prefetch_tile(
            op,
            ticket,
            layer,
            group,
            weights,
            HIDDEN,
            qkv_width,
            attn_width,
            INTERMEDIATE,
            VOCAB,
            BLOCK_N,
            BLOCK_K,
            PREFETCH,
        )
    while ticket < num_tiles:
        following = tl.atomic_add(claim, 1, sem="relaxed")  # (the next ticket, taken while this tile runs)
        while ticket >= first + tiles:  # (the ticket's step: tickets only grow, so a program walks forward)
            step += 1
            op, tiles, layer, group, position, first, producer, need = _row(table_ptr, step)
        tile = ticket - first
        ahead, n_op, n_tiles, n_layer, n_group, n_first = step, op, tiles, layer, group, first
        while (following >= n_first + n_tiles) & (following < num_tiles):  # (the next ticket's step)
            ahead += 1
            n_op, n_tiles, n_layer, n_group, _, n_first, _, _ = _row(table_ptr, ahead)
        if following < num_tiles:
            _prefetch_tile(
                n_op,
                following - n_first,
                n_layer,
                n_group,
                weights,
                HIDDEN,
                qkv_width,
                attn_width,
                INTERMEDIATE,
                VOCAB,
                BLOCK_N,
                BLOCK_K,
                PREFETCH,
            )
        stamps = trace_ptr + 4 * ticket  # (TRACE: the tile's start, end of its wait, end, and program)
        _stamp(stamps, TRACE)
        mine = counters_ptr + step * COUNTERS
        theirs = counters_ptr + producer * COUNTERS
        tokens = tl.where(position == 1, 2, 1)
        rows_ok = r < batch * tokens
        n0 = tile * BLOCK_N
        if op == _QKV:
            w_qkv = qkv_w_ptr + layer * qkv_width * HIDDEN
            if producer >= 0:
                _wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            norm = in_norm_ptr + layer * HIDDEN
            acc, _ = _normed_product(
                h_ptr, r, rows_ok, eps, norm, w_qkv, w_qkv, n0, qkv_width, HIDDEN, False, BLOCK_N, BLOCK_H
            )
            out = qkv_ptr + r[:, None] * qkv_width + (n0 + nn)[None, :]
            tl.store(out, acc.to(dt), mask=rows_ok[:, None] & ((n0 + nn) < qkv_width)[None, :])
            head = n0 // HEAD_DIM  # (q heads, then k heads, then v heads)
            kv_head = tl.where(head < HEADS, head // group_heads, (head - HEADS) % KV_HEADS)
            _signal(mine + 1 + kv_head)
        elif op == _ATTN:
            j = tile % KV_HEADS
            _wait(theirs + 1 + j, qkv_group_tiles, unmet, stamps + 1, SPIN, TRACE)
            _attend(
                qkv_ptr,
                attn_ptr,
                keys_ptr,
                values_ptr,
                q_norm_ptr + layer * HEAD_DIM,
                k_norm_ptr + layer * HEAD_DIM,
                cos_ptr,
                sin_ptr,
                tile,
                layer,
                position,
                tokens,
                batch,
                eps,
                scale,
                HEADS,
                KV_HEADS,
                HEAD_DIM,
                CAPACITY,
            )
            _signal(mine + 1 + j)
        elif op == _GATE_UP:
            w_gate = gate_up_w_ptr + layer * 2 * INTERMEDIATE * HIDDEN
            w_up = w_gate + INTERMEDIATE * HIDDEN
            _wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            norm = post_norm_ptr + layer * HIDDEN
            g, u = _normed_product(
                h_ptr, r, rows_ok, eps, norm, w_gate, w_up, n0, INTERMEDIATE, HIDDEN, True, BLOCK_N, BLOCK_H
            )
            g = g.to(dt).to(tl.float32)
            u = u.to(dt).to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            out = act_ptr + r[:, None] * INTERMEDIATE + (n0 + nn)[None, :]
            tl.store(out, (silu * u).to(dt), mask=rows_ok[:, None] & ((n0 + nn) < INTERMEDIATE)[None, :])
            _signal(mine + 1 + n0 // BLOCK_K)
        elif op == _HEAD:
            w_head = heads_ptr + group * VOCAB * HIDDEN
            _wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            last = r * tokens + tokens - 1
            ok = r < batch
            norm = final_norm_ptr
            logits, _ = _normed_product(
                h_ptr, last, ok, eps, norm, w_head, w_head, n0, VOCAB, HIDDEN, False, BLOCK_N, BLOCK_H
            )
            out = logits_ptr + r[:, None] * VOCAB + (n0 + nn)[None, :]
            tl.store(out, logits.to(dt), mask=ok[:, None] & ((n0 + nn) < VOCAB)[None, :])
            _signal(mine + _DONE)
        elif op == _SAMPLE:
            _wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            cols = tl.arange(0, BLOCK_V)
            valid = cols < VOCAB
            scores = tl.load(logits_ptr + tile * VOCAB + cols, mask=valid, other=float("-inf"), cache_modifier=".cg")
            code = pick(scores.to(tl.float32), tile, cols, valid, VOCAB, flags, group, sampling, BLOCK_V, CANDIDATES)
            tl.store(codes_ptr + tile * (GROUPS - 1) + group, code)
            hh = tl.arange(0, BLOCK_H)
            h_ok = hh < HIDDEN
            e = tl.load(embeds_ptr + (group * VOCAB + code) * HIDDEN + hh, mask=h_ok, other=0.0)
            running = tl.load(total_ptr + tile * HIDDEN + hh, mask=h_ok, other=0.0, cache_modifier=".cg")
            tl.store(total_ptr + tile * HIDDEN + hh, (running.to(tl.float32) + e.to(tl.float32)).to(dt), mask=h_ok)
            if group < GROUPS - 2:  # (the next pass's input: the request's residual row)
                tl.store(h_ptr + tile * HIDDEN + hh, e, mask=h_ok)
            _signal(mine + _DONE)
        else:  # OUT, DOWN: a share of the output projection's inputs -> one partial sum of a column block
            split = tile // hidden_blocks
            column = tile % hidden_blocks
            n0 = column * BLOCK_N
            k0 = split * BLOCK_K
            ks = k0 + tl.arange(0, BLOCK_K)
            if op == _OUT:
                w_part = _weights(o_w_ptr + layer * HIDDEN * attn_width, n0, HIDDEN, attn_width, k0, BLOCK_N, BLOCK_K)
                last_head = (tl.minimum(k0 + BLOCK_K, attn_width) - 1) // HEAD_DIM // group_heads
                for j in range(k0 // HEAD_DIM // group_heads, last_head + 1):
                    _wait(theirs + 1 + j, batch, unmet, stamps + 1, SPIN, TRACE)
                x_mask = rows_ok[:, None] & (ks < attn_width)[None, :]
                x_part = tl.load(
                    attn_ptr + r[:, None] * attn_width + ks[None, :], mask=x_mask, other=0.0, cache_modifier=".cg"
                )
            else:
                w_part = _weights(
                    down_w_ptr + layer * HIDDEN * INTERMEDIATE, n0, HIDDEN, INTERMEDIATE, k0, BLOCK_N, BLOCK_K
                )
                _wait(
                    theirs + 1 + split,
                    tl.minimum(split_tiles, gate_up_tiles - split * split_tiles),
                    unmet,
                    stamps + 1,
                    SPIN,
                    TRACE,
                )
                x_mask = rows_ok[:, None] & (ks < INTERMEDIATE)[None, :]
                x_part = tl.load(
                    act_ptr + r[:, None] * INTERMEDIATE + ks[None, :], mask=x_mask, other=0.0, cache_modifier=".cg"
                )
            acc = tl.dot(x_part.to(w_part.dtype), tl.trans(w_part))
            out = part_ptr + split * part_size + r[:, None] * HIDDEN + (n0 + nn)[None, :]
            tl.store(out, acc, mask=rows_ok[:, None] & ((n0 + nn) < HIDDEN)[None, :])
            tl.debug_barrier()  # (every thread's stores issued before the count says the part is written)
            added = tl.atomic_add(mine + 1 + column, 1, sem="acq_rel")
            tl.debug_barrier()
            if op == _OUT:  # the block's last part written: the residual takes them all (this tile), then DONE
                if added == out_splits - 1:
                    _reduce(h_ptr, part_ptr, column, rows_ok, out_splits, HIDDEN, BLOCK_N)
                    _signal(mine + _DONE)
            elif added == down_splits - 1:
                _reduce(h_ptr, part_ptr, column, rows_ok, down_splits, HIDDEN, BLOCK_N)
                _signal(mine + _DONE)
        _stamp(stamps + 2, TRACE)
        if TRACE:
            tl.store(stamps + 3, tl.program_id(0).to(tl.int64))
        ticket = following


MAX_BATCH = 4  # frames of up to this many requests take the persistent kernel (more: the layered path)
PROGRAMS_PER_SM = 1  # programs the kernel launches per SM on CUDA (its registers: one 8-warp program fits an SM)
WARPS = 8  # warps of a program


class PersistentCodePredictor:
    """``CodePredictor.forward`` for frames of up to ``MAX_BATCH`` requests in one launch of
    ``code_predictor_frame``. Built once the weights are loaded (``use_persistent``): the layers' weights
    are stacked per kind into one tensor each and, where the fused decoder kernels merged them, the
    modules' parameters become views of those stacks (nothing held twice)."""

    max_batch = MAX_BATCH

    def __init__(self, cp, cos: torch.Tensor, sin: torch.Tensor):
        """``cp``: a ``CodePredictor``; cos/sin: its rotary tables of positions 0..CAPACITY-1 [CAPACITY, head_dim]
        (``rotary.rotary_tables``' rounding and sign), CAPACITY = ``capacity(cp.num_code_groups)``."""
        cfg, model = cp.cfg, cp.model
        p = cp.lm_head[0].weight
        shape = lambda batch: Shape(  # noqa: E731
            batch,
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
            cp.num_code_groups,
        )
        self.eps, self.device, self.dtype = cfg.rms_norm_eps, p.device, p.dtype
        layers = list(model.layers)
        self.in_norm = _stack([layer.input_layernorm.weight for layer in layers])
        self.q_norm = _stack([layer.self_attn.q_norm.weight for layer in layers])
        self.k_norm = _stack([layer.self_attn.k_norm.weight for layer in layers])
        self.post_norm = _stack([layer.post_attention_layernorm.weight for layer in layers])
        self.qkv = _stack([_qkv_weight(layer.self_attn) for layer in layers])
        self.o = _stack([layer.self_attn.o_proj.weight for layer in layers])
        self.gate_up = _stack([_gate_up_weight(layer.mlp) for layer in layers])
        self.down = _stack([layer.mlp.down_proj.weight for layer in layers])
        self.final_norm = model.norm.weight.data
        self.heads = _stack([head.weight for head in cp.lm_head])
        self.embeds = _stack([table.weight for table in model.codec_embedding])
        self.cos, self.sin, self.capacity = cos.contiguous(), sin.contiguous(), capacity(cp.num_code_groups)
        self.schedules = {b: Schedule(shape(b)) for b in range(1, MAX_BATCH + 1)}
        self.tables = {b: s.table(self.device) for b, s in self.schedules.items()}
        self.programs, self.prefetches = 1, False  # (Triton's interpreter: one program, no PTX)
        self.compiled = self.device.type == "cuda" and not triton.knobs.runtime.interpret
        # a benchmark's timeline: an int64 tensor [tiles of the frame, 4] (each tile's start, end of its wait,
        # end, program) the next launches fill; None: not recorded (CUDA only: the GPU's global timer)
        self.trace: torch.Tensor | None = None
        if self.compiled:
            self.programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(self.device).multi_processor_count
            self.prefetches = True

    def __call__(self, talker_hidden: torch.Tensor, code0_embedding: torch.Tensor, params) -> tuple:
        """As ``CodePredictor.forward`` with draws by ``sampling.draw(logits, params, group - 1)``:
        (codes [B, G-1] int64, the sum of their embeddings [B, hidden]). No host reads: graph-capturable."""
        from omniwalk.kernels.sampling import TOP_CANDIDATES, _param_args

        batch, hidden = talker_hidden.shape
        schedule, table = self.schedules[batch], self.tables[batch]
        shape = schedule.shape
        device, dtype = talker_hidden.device, self.dtype
        h = torch.empty(ROWS, hidden, dtype=dtype, device=device)  # the residual rows (the first pass: two each)
        h[: 2 * batch] = torch.stack([talker_hidden, code0_embedding], dim=1).reshape(2 * batch, hidden)
        parts = max(shape.splits(OUT), shape.splits(DOWN))
        part = torch.empty(parts, ROWS, hidden, dtype=torch.float32, device=device)
        qkv = torch.empty(shape.max_rows, shape.qkv, dtype=dtype, device=device)
        attn = torch.empty(shape.max_rows, shape.heads * shape.head_dim, dtype=dtype, device=device)
        act = torch.empty(shape.max_rows, shape.intermediate, dtype=dtype, device=device)
        kv = (shape.layers, batch, self.capacity, shape.kv_heads, shape.head_dim)
        keys, values = torch.empty(kv, dtype=dtype, device=device), torch.empty(kv, dtype=dtype, device=device)
        logits = torch.empty(batch, shape.vocab, dtype=dtype, device=device)
        codes = torch.empty(batch, shape.groups - 1, dtype=torch.long, device=device)
        total = torch.zeros(batch, hidden, dtype=dtype, device=device)
        counters = torch.zeros(len(schedule.steps) * shape.counters + 2, dtype=torch.int32, device=device)
        args, flags = _param_args(params, device, skip_front=False)
        block_v = 1 << (shape.vocab - 1).bit_length()
        code_predictor_frame[(self.programs,)](
            table,
            len(schedule.steps),
            schedule.num_tiles,
            counters,
            self.in_norm,
            self.qkv,
            self.q_norm,
            self.k_norm,
            self.o,
            self.post_norm,
            self.gate_up,
            self.down,
            self.final_norm,
            self.heads,
            self.embeds,
            self.cos,
            self.sin,
            h,
            part,
            qkv,
            attn,
            act,
            keys,
            values,
            logits,
            codes,
            total,
            *args,
            codes if self.trace is None else self.trace,  # (unused where not traced)
            flags,
            batch,
            self.eps,
            shape.head_dim**-0.5,
            HIDDEN=hidden,
            HEADS=shape.heads,
            KV_HEADS=shape.kv_heads,
            HEAD_DIM=shape.head_dim,
            INTERMEDIATE=shape.intermediate,
            VOCAB=shape.vocab,
            GROUPS=shape.groups,
            CAPACITY=self.capacity,
            COUNTERS=shape.counters,
            BLOCK_N=shape.block_n,
            BLOCK_K=shape.block_k,
            BLOCK_V=block_v,
            BLOCK_H=1 << (hidden - 1).bit_length(),
            CANDIDATES=min(TOP_CANDIDATES, block_v),
            PREFETCH=self.prefetches,
            SPIN=self.compiled,
            TRACE=self.trace is not None,
            num_warps=WARPS,
        )
        if not self.compiled and counters[-1].item():
            raise RuntimeError(f"{counters[-1].item()} waits of the frame's tiles were not met in claim order")
        return codes, total


def capacity(groups: int) -> int:
    """Positions a frame's KV holds per request (a power of two: the attention's block)."""
    return 1 << (groups - 1).bit_length()


def _stack(params: list[torch.Tensor]) -> torch.Tensor:
    """One tensor [n, *shape] of ``params``; each parameter then becomes a view of its slice."""
    stacked = torch.stack([p.data for p in params])
    for i, p in enumerate(params):
        if isinstance(p, torch.nn.Parameter):
            p.data = stacked[i]
    return stacked


def _qkv_weight(attention) -> torch.Tensor:
    """The merged q/k/v weight (the fused kernels' ``qkv_proj``; else the three concatenated: the reference)."""
    if attention.qkv_proj is not None:
        return attention.qkv_proj.weight
    return torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])


def _gate_up_weight(mlp) -> torch.Tensor:
    if mlp.gate_up_proj is not None:
        return mlp.gate_up_proj.weight
    return torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
