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
    SELECT   a part of a request's logits (256 ids): its best candidates for the draw (where top-k /
             top-p apply, its best 64 processed scores; else its best perturbed score)
    SAMPLE   a request: its code drawn from its parts' candidates (``kernels/sampling.py``'s steps; a
             top_k over 64: from its whole row), its embedding the next input

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

from omniwalk.kernels.frame import FrameWeights, capacity, frame_shape
from omniwalk.kernels.persistent_schedule import (
    ATTN,
    DONE,
    DOWN,
    GATE_UP,
    HEAD,
    OUT,
    QKV,
    ROWS,
    SAMPLE,
    SELECT,
    Schedule,
)
from omniwalk.kernels.persistent_tiles import (
    attend,
    load_weights,
    normed_product,
    prefetch_tile,
    reduce_block,
    signal,
    stamp,
    table_row,
    wait,
)
from omniwalk.kernels.sampling import part_candidates, pick, pick_candidates, whole_row

# (the kernel's copies of the schedule's constants)
_QKV, _ATTN, _OUT, _GATE_UP, _HEAD, _SAMPLE, _SELECT = (
    tl.constexpr(v) for v in (QKV, ATTN, OUT, GATE_UP, HEAD, SAMPLE, SELECT)
)
_ROWS, _DONE = tl.constexpr(ROWS), tl.constexpr(DONE)


# (one long function: the loop that claims tiles and dispatches the eight ops, each op's body inline; its
# device functions are in ``persistent_tiles``. A function per op body would take ~20 pointer and constexpr
# arguments each, as long again at the call sites; Triton inlines either way.)
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
    candidates_ptr,
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
    PART: tl.constexpr,
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
    parts: tl.constexpr = BLOCK_V // PART  # (SELECT tiles of a request)
    sampling = (temperature_ptr, penalty_ptr, seen_ptr, seen_stride, banned_ptr, banned_stride, allowed_ptr)
    sampling += (allowed_stride, top_k_ptr, top_p_ptr, sampled_ptr, seeds_ptr, steps_ptr)  # (``sampling.pick``'s)
    r = tl.arange(0, _ROWS)
    nn = tl.arange(0, BLOCK_N)
    claim = counters_ptr + num_steps * COUNTERS  # the frame's tiles, claimed in order
    unmet = claim + 1  # (waits not met where they cannot be: ``wait``)
    ticket = tl.atomic_add(claim, 1, sem="relaxed")
    step = 0
    op, tiles, layer, group, position, first, producer, need = table_row(table_ptr, 0)
    weights = (qkv_w_ptr, o_w_ptr, gate_up_w_ptr, down_w_ptr, heads_ptr)
    if ticket < tiles:  # (the program's first tile: those after it are asked for one tile ahead)
        prefetch_tile(
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
            op, tiles, layer, group, position, first, producer, need = table_row(table_ptr, step)
        tile = ticket - first
        ahead, n_op, n_tiles, n_layer, n_group, n_first = step, op, tiles, layer, group, first
        while (following >= n_first + n_tiles) & (following < num_tiles):  # (the next ticket's step)
            ahead += 1
            n_op, n_tiles, n_layer, n_group, _, n_first, _, _ = table_row(table_ptr, ahead)
        if following < num_tiles:
            prefetch_tile(
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
        stamp(stamps, TRACE)
        mine = counters_ptr + step * COUNTERS
        theirs = counters_ptr + producer * COUNTERS
        tokens = tl.where(position == 1, 2, 1)
        rows_ok = r < batch * tokens
        n0 = tile * BLOCK_N
        if op == _QKV:
            w_qkv = qkv_w_ptr + layer * qkv_width * HIDDEN
            if producer >= 0:
                wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            norm = in_norm_ptr + layer * HIDDEN
            acc, _ = normed_product(
                h_ptr, r, rows_ok, eps, norm, w_qkv, w_qkv, n0, qkv_width, HIDDEN, False, BLOCK_N, BLOCK_H
            )
            out = qkv_ptr + r[:, None] * qkv_width + (n0 + nn)[None, :]
            tl.store(out, acc.to(dt), mask=rows_ok[:, None] & ((n0 + nn) < qkv_width)[None, :])
            head = n0 // HEAD_DIM  # (q heads, then k heads, then v heads)
            kv_head = tl.where(head < HEADS, head // group_heads, (head - HEADS) % KV_HEADS)
            signal(mine + 1 + kv_head)
        elif op == _ATTN:
            j = tile % KV_HEADS
            wait(theirs + 1 + j, qkv_group_tiles, unmet, stamps + 1, SPIN, TRACE)
            attend(
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
            signal(mine + 1 + j)
        elif op == _GATE_UP:
            w_gate = gate_up_w_ptr + layer * 2 * INTERMEDIATE * HIDDEN
            w_up = w_gate + INTERMEDIATE * HIDDEN
            wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            norm = post_norm_ptr + layer * HIDDEN
            g, u = normed_product(
                h_ptr, r, rows_ok, eps, norm, w_gate, w_up, n0, INTERMEDIATE, HIDDEN, True, BLOCK_N, BLOCK_H
            )
            g = g.to(dt).to(tl.float32)
            u = u.to(dt).to(tl.float32)
            silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            out = act_ptr + r[:, None] * INTERMEDIATE + (n0 + nn)[None, :]
            tl.store(out, (silu * u).to(dt), mask=rows_ok[:, None] & ((n0 + nn) < INTERMEDIATE)[None, :])
            signal(mine + 1 + n0 // BLOCK_K)
        elif op == _HEAD:
            w_head = heads_ptr + group * VOCAB * HIDDEN
            wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            last = r * tokens + tokens - 1
            ok = r < batch
            norm = final_norm_ptr
            logits, _ = normed_product(
                h_ptr, last, ok, eps, norm, w_head, w_head, n0, VOCAB, HIDDEN, False, BLOCK_N, BLOCK_H
            )
            out = logits_ptr + r[:, None] * VOCAB + (n0 + nn)[None, :]
            tl.store(out, logits.to(dt), mask=ok[:, None] & ((n0 + nn) < VOCAB)[None, :])
            signal(mine + _DONE)
        elif op == _SELECT:  # a part of a request's logits -> its candidates for the draw
            wait(theirs + _DONE, need, unmet, stamps + 1, SPIN, TRACE)
            b = tile // parts
            cols = (tile % parts) * PART + tl.arange(0, PART)
            valid = cols < VOCAB
            scores = tl.load(logits_ptr + b * VOCAB + cols, mask=valid, other=float("-inf"), cache_modifier=".cg")
            keys = part_candidates(
                scores.to(tl.float32), b, cols, valid, VOCAB, flags, group, sampling, BLOCK_V, CANDIDATES
            )
            tl.store(candidates_ptr + tile * CANDIDATES + tl.arange(0, CANDIDATES), keys)
            signal(mine + 1 + b)
        elif op == _SAMPLE:
            wait(theirs + 1 + tile, parts, unmet, stamps + 1, SPIN, TRACE)
            if whole_row(tile, VOCAB, flags, top_k_ptr, top_p_ptr, CANDIDATES):  # (top_k > CANDIDATES)
                cols = tl.arange(0, BLOCK_V)
                valid = cols < VOCAB
                scores = tl.load(
                    logits_ptr + tile * VOCAB + cols, mask=valid, other=float("-inf"), cache_modifier=".cg"
                )
                code = pick(
                    scores.to(tl.float32), tile, cols, valid, VOCAB, flags, group, sampling, BLOCK_V, CANDIDATES
                )
            else:
                at = tile * parts * CANDIDATES + tl.arange(0, parts * CANDIDATES)
                keys = tl.load(candidates_ptr + at, cache_modifier=".cg")
                code = pick_candidates(keys, tile, VOCAB, flags, group, sampling, BLOCK_V, CANDIDATES)
            tl.store(codes_ptr + tile * (GROUPS - 1) + group, code)
            hh = tl.arange(0, BLOCK_H)
            h_ok = hh < HIDDEN
            e = tl.load(embeds_ptr + (group * VOCAB + code) * HIDDEN + hh, mask=h_ok, other=0.0)
            running = tl.load(total_ptr + tile * HIDDEN + hh, mask=h_ok, other=0.0, cache_modifier=".cg")
            tl.store(total_ptr + tile * HIDDEN + hh, (running.to(tl.float32) + e.to(tl.float32)).to(dt), mask=h_ok)
            if group < GROUPS - 2:  # (the next pass's input: the request's residual row)
                tl.store(h_ptr + tile * HIDDEN + hh, e, mask=h_ok)
            signal(mine + _DONE)
        else:  # OUT, DOWN: a share of the output projection's inputs -> one partial sum of a column block
            split = tile // hidden_blocks
            column = tile % hidden_blocks
            n0 = column * BLOCK_N
            k0 = split * BLOCK_K
            ks = k0 + tl.arange(0, BLOCK_K)
            if op == _OUT:
                w_part = load_weights(
                    o_w_ptr + layer * HIDDEN * attn_width, n0, HIDDEN, attn_width, k0, BLOCK_N, BLOCK_K
                )
                last_head = (tl.minimum(k0 + BLOCK_K, attn_width) - 1) // HEAD_DIM // group_heads
                for j in range(k0 // HEAD_DIM // group_heads, last_head + 1):
                    wait(theirs + 1 + j, batch, unmet, stamps + 1, SPIN, TRACE)
                x_mask = rows_ok[:, None] & (ks < attn_width)[None, :]
                x_part = tl.load(
                    attn_ptr + r[:, None] * attn_width + ks[None, :], mask=x_mask, other=0.0, cache_modifier=".cg"
                )
            else:
                w_part = load_weights(
                    down_w_ptr + layer * HIDDEN * INTERMEDIATE, n0, HIDDEN, INTERMEDIATE, k0, BLOCK_N, BLOCK_K
                )
                wait(
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
                    reduce_block(h_ptr, part_ptr, column, rows_ok, out_splits, HIDDEN, BLOCK_N)
                    signal(mine + _DONE)
            elif added == down_splits - 1:
                reduce_block(h_ptr, part_ptr, column, rows_ok, down_splits, HIDDEN, BLOCK_N)
                signal(mine + _DONE)
        stamp(stamps + 2, TRACE)
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
        cfg, p = cp.cfg, cp.lm_head[0].weight
        self.eps, self.device, self.dtype = cfg.rms_norm_eps, p.device, p.dtype
        self.weights = FrameWeights.of(cp)
        self.cos, self.sin, self.capacity = cos.contiguous(), sin.contiguous(), capacity(cp.num_code_groups)
        self.schedules = {b: Schedule(frame_shape(cp, b)) for b in range(1, MAX_BATCH + 1)}
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
        from omniwalk.kernels.sampling import _param_args

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
        candidates = torch.empty(batch * shape.parts * shape.candidates, dtype=torch.long, device=device)
        codes = torch.empty(batch, shape.groups - 1, dtype=torch.long, device=device)
        total = torch.zeros(batch, hidden, dtype=dtype, device=device)
        counters = torch.zeros(len(schedule.steps) * shape.counters + 2, dtype=torch.int32, device=device)
        args, flags = _param_args(params, device, skip_front=False)
        code_predictor_frame[(self.programs,)](
            table,
            len(schedule.steps),
            schedule.num_tiles,
            counters,
            *self.weights.tensors(),
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
            candidates,
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
            BLOCK_V=shape.block_v,
            BLOCK_H=1 << (hidden - 1).bit_length(),
            CANDIDATES=shape.candidates,
            PART=shape.part_width,
            PREFETCH=self.prefetches,
            SPIN=self.compiled,
            TRACE=self.trace is not None,
            num_warps=WARPS,
        )
        if not self.compiled and counters[-1].item():
            raise RuntimeError(f"{counters[-1].item()} waits of the frame's tiles were not met in claim order")
        return codes, total
