"""The persistent code-predictor kernel's device functions (``kernels/persistent.py``): a tile's weights
loaded or asked into L2, the normed products, a column block's partial sums reduced into the residual, the
counters' waits and signals, a step's table row, and a kv head's attention. Triton inlines them into
``code_predictor_frame``."""

from __future__ import annotations

import triton
import triton.language as tl

from omniwalk.kernels.persistent_schedule import COLUMNS, DOWN, GATE_UP, HEAD, NORM_K, OUT, QKV, ROWS

# (the kernel's copies of the schedule's constants)
_QKV, _OUT, _GATE_UP, _DOWN, _HEAD = (tl.constexpr(v) for v in (QKV, OUT, GATE_UP, DOWN, HEAD))
_COLUMNS, _ROWS, _NORM_K = tl.constexpr(COLUMNS), tl.constexpr(ROWS), tl.constexpr(NORM_K)


@triton.jit
def load_weights(w_ptr, n0, N: tl.constexpr, K: tl.constexpr, k0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns n0.. of w [N, K] over inputs k0 .. k0 + BLOCK_K: a tile [BLOCK_N, BLOCK_K] (loaded before the
    tile waits: weights depend on nothing the kernel writes)."""
    nn = n0 + tl.arange(0, BLOCK_N)
    ks = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + nn[:, None] * K + ks[None, :], mask=(nn < N)[:, None] & (ks < K)[None, :], other=0.0)


@triton.jit
def normed_product(
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
def prefetch(w_ptr, n0, N: tl.constexpr, K: tl.constexpr, k0, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
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
def prefetch_tile(
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
            prefetch(qkv_w_ptr + layer * QKV_WIDTH * HIDDEN, n0, QKV_WIDTH, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _GATE_UP:
            w_gate = gate_up_w_ptr + layer * 2 * INTERMEDIATE * HIDDEN
            prefetch(w_gate, n0, INTERMEDIATE, HIDDEN, 0, BLOCK_N, HIDDEN)
            prefetch(w_gate + INTERMEDIATE * HIDDEN, n0, INTERMEDIATE, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _HEAD:
            prefetch(heads_ptr + group * VOCAB * HIDDEN, n0, VOCAB, HIDDEN, 0, BLOCK_N, HIDDEN)
        elif op == _OUT:
            split, column = tile // blocks, tile % blocks
            w_o = o_w_ptr + layer * HIDDEN * ATTN_WIDTH
            prefetch(w_o, column * BLOCK_N, HIDDEN, ATTN_WIDTH, split * BLOCK_K, BLOCK_N, BLOCK_K)
        elif op == _DOWN:
            split, column = tile // blocks, tile % blocks
            w_down = down_w_ptr + layer * HIDDEN * INTERMEDIATE
            prefetch(w_down, column * BLOCK_N, HIDDEN, INTERMEDIATE, split * BLOCK_K, BLOCK_N, BLOCK_K)


@triton.jit
def reduce_block(h_ptr, part_ptr, column, rows_ok, SPLITS: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_N: tl.constexpr):
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
def wait(counter_ptr, count, unmet_ptr, trace_ptr, SPIN: tl.constexpr, TRACE: tl.constexpr):
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
    stamp(trace_ptr, TRACE)


@triton.jit
def stamp(at_ptr, TRACE: tl.constexpr):
    """``TRACE`` (a benchmark's timeline of the frame, ``PersistentCodePredictor.trace``): the GPU's global
    timer (ns) at ``at_ptr``."""
    if TRACE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(at_ptr, now)


@triton.jit
def signal(counter_ptr):
    tl.debug_barrier()  # (every thread's stores issued before the count says they are done)
    tl.atomic_add(counter_ptr, 1, sem="release")


@triton.jit
def table_row(table_ptr, step):
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
def head_rope(base, d, dr, rstd, norm_ptr, cos, sin, dt):
    """One head's (or heads' [n, D]) q/k norm then rope at the loaded cos/sin, rounded as the reference
    (``_head_norm``, then ``apply_rotary``'s two products and their sum)."""
    x = tl.load(base + d, cache_modifier=".cg").to(tl.float32)
    xr = tl.load(base + dr, cache_modifier=".cg").to(tl.float32)
    x = (tl.load(norm_ptr + d).to(tl.float32) * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    xr = (tl.load(norm_ptr + dr).to(tl.float32) * (xr * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return ((x * cos).to(dt).to(tl.float32) + (xr * sin).to(dt).to(tl.float32)).to(dt)


@triton.jit
def attend(
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
        k = head_rope(k_base, d, dr, tl.rsqrt(tl.sum(kx * kx, 0) / HEAD_DIM + eps), k_norm_ptr, cos, sin, dt)
        v = tl.load(base + (HEADS + KV_HEADS + j) * HEAD_DIM + d, cache_modifier=".cg")
        at = ((layer * batch + b) * CAPACITY + pos) * KV_HEADS * HEAD_DIM + j * HEAD_DIM + d
        tl.store(keys_ptr + at, k)
        tl.store(values_ptr + at, v)
        tl.debug_barrier()  # (the program's own stores, read back below by its other threads)
        q_at = q_heads[:, None] * HEAD_DIM
        qx = tl.load(base + q_at + d[None, :], cache_modifier=".cg").to(tl.float32)
        q_rstd = tl.rsqrt(tl.sum(qx * qx, 1) / HEAD_DIM + eps)[:, None]
        q = head_rope(base + q_at, d[None, :], dr[None, :], q_rstd, q_norm_ptr, cos[None, :], sin[None, :], dt)
        seen = slots <= pos
        keys = tl.load(keys_ptr + cache, mask=seen[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        values = tl.load(values_ptr + cache, mask=seen[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        scores = tl.sum(q.to(tl.float32)[:, None, :] * keys[None, :, :], 2) * scale
        scores = tl.where(seen[None, :], scores, float("-inf"))
        e = tl.exp(scores - tl.max(scores, 1)[:, None])
        out = tl.sum(e[:, :, None] * values[None, :, :], 1) / tl.sum(e, 1)[:, None]
        tl.store(attn_ptr + row * HEADS * HEAD_DIM + q_at + d[None, :], out.to(dt))
