"""The persistent code-predictor kernel's schedule (``kernels/persistent.py``): the steps of a frame, what
each step's tiles wait for and signal, the table the kernel reads, and the model of what every tile reads
and writes that ``Schedule.check`` proves the waits against (the CPU model of the kernel's dependencies).

A frame's tiles are numbered in one sequence, step after step; the kernel's programs claim them in that
order from one counter. A tile waits only for counters of an earlier step (``waits``), and signals one
counter of its own step when it is done (``signals``), so the tile with the lowest number not yet done
can always run: no program waits on a tile that no running program holds. There is no barrier between
steps: a tile starts as soon as what it reads is written, and loads its weights before it waits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniwalk.kernels.sampling import TOP_CANDIDATES

QKV, ATTN, OUT, GATE_UP, DOWN, HEAD, SAMPLE, SELECT = range(8)
OPS = ("QKV", "ATTN", "OUT", "GATE_UP", "DOWN", "HEAD", "SAMPLE", "SELECT")
COLUMNS = 8  # a step's row in the table: op, tiles, layer, group, position, first tile, producer, need
TILE_WIDTHS = (32, 16)  # output columns of a projection tile: the widest that divides head_dim (16: tl.dot's least)
NORM_K = 256  # inputs a norm's projection tile multiplies at once (its registers: the kernel's largest op)
ROWS = 16  # token rows a tile multiplies at once (a ``tl.dot``'s smallest height; masked past the batch's)
DONE = 0  # a step's counter of finished work its consumers wait for whole (tiles; OUT, DOWN: blocks reduced)
PART_WIDTH = 256  # ids of a row that one SELECT tile takes (it hands the draw its best ``Shape.candidates``)


@dataclass(frozen=True)
class Shape:
    """The code predictor's sizes (``DecoderConfig`` of it) and the batch a schedule is for."""

    batch: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    groups: int  # codec groups (the first drawn by the talker; this kernel draws 1..groups-1)

    def __post_init__(self):
        if self.head_dim % TILE_WIDTHS[-1] or self.heads % self.kv_heads:
            raise ValueError(f"head_dim must be a multiple of {TILE_WIDTHS[-1]} and heads of kv_heads: {self}")

    @property
    def block_n(self) -> int:
        """Output columns of a projection tile (one tile's columns lie in one head)."""
        return next(n for n in TILE_WIDTHS if self.head_dim % n == 0)

    @property
    def block_v(self) -> int:
        """A row of logits padded to a power of two (the draw's block)."""
        return 1 << (self.vocab - 1).bit_length()

    @property
    def candidates(self) -> int:
        """The best ids of a part that its draw takes (the draw's partial sort: top_k up to this many)."""
        return min(TOP_CANDIDATES, self.block_v)

    @property
    def part_width(self) -> int:
        """Ids of a row one SELECT tile takes."""
        return max(min(PART_WIDTH, self.block_v), self.candidates)

    @property
    def parts(self) -> int:
        """SELECT tiles a row has."""
        return self.block_v // self.part_width

    @property
    def qkv(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def max_rows(self) -> int:
        return 2 * self.batch  # the first pass has two token rows per request

    @property
    def block_k(self) -> int:
        """The share of the output projections' inputs each of their tiles takes (their products are split
        into partial sums, which the last tile of a column block to finish adds to the residual)."""
        return min(512, 1 << (min(self.hidden, self.heads * self.head_dim, self.intermediate) - 1).bit_length())

    def blocks_of(self, n: int) -> range:
        """The ``block_n``-wide column blocks of n columns."""
        return range(-(-n // self.block_n))

    @property
    def hidden_blocks(self) -> int:
        return len(self.blocks_of(self.hidden))

    @property
    def counters(self) -> int:
        """Counters a step has: DONE, then one per group its consumers wait for (kv heads, DOWN's input
        splits, column blocks)."""
        return 1 + max(self.hidden_blocks, self.kv_heads, self.splits(DOWN), self.batch)

    def splits(self, op: int) -> int:
        """OUT and DOWN: the partial sums of a column block (their inputs split ``block_k`` columns a part)."""
        inputs = {OUT: self.heads * self.head_dim, DOWN: self.intermediate}
        return -(-inputs[op] // self.block_k) if op in inputs else 0

    def tiles(self, op: int) -> int:
        columns = {QKV: self.qkv, OUT: self.hidden, GATE_UP: self.intermediate, DOWN: self.hidden, HEAD: self.vocab}
        if op in columns:
            return len(self.blocks_of(columns[op])) * max(1, self.splits(op))
        return self.batch * {ATTN: self.kv_heads, SELECT: self.parts}.get(op, 1)

    def kv_head_of(self, qkv_tile: int) -> int:
        """The kv head whose attention reads a QKV tile's columns (q of its heads, its k, its v)."""
        column, width = qkv_tile * self.block_n, self.heads * self.head_dim
        if column < width:
            return column // self.head_dim // (self.heads // self.kv_heads)
        return (column - width) // self.head_dim % self.kv_heads

    @property
    def qkv_tiles_per_kv_head(self) -> int:
        """QKV tiles whose columns one kv head's attention reads (q of its heads, its k, its v)."""
        return (self.heads // self.kv_heads + 2) * self.head_dim // self.block_n

    def kv_heads_of(self, out_split: int) -> range:
        """The kv heads whose attention output an OUT split's inputs are."""
        first = out_split * self.block_k
        last = min(first + self.block_k, self.heads * self.head_dim) - 1
        group = self.heads // self.kv_heads
        return range(first // self.head_dim // group, last // self.head_dim // group + 1)

    def gate_up_tiles_of(self, down_split: int) -> int:
        """GATE_UP tiles whose columns a DOWN split's inputs are."""
        per = self.block_k // self.block_n
        return min(per, len(self.blocks_of(self.intermediate)) - down_split * per)


@dataclass(frozen=True)
class Step:
    op: int
    tiles: int
    layer: int  # decoder layer (projections, norms, the KV of ATTN)
    group: int  # the head / embedding table index (HEAD: lm_head[group]; SELECT, SAMPLE: draw group + 1)
    position: int  # rope position of the pass's last token (a pass of two tokens: position - 1 too)
    first: int  # the number of its first tile in the frame's sequence
    producer: int  # the step whose counters its tiles wait for (-1: none, the frame's first step)
    need: int  # a wait on the producer's DONE: the count it waits for

    @property
    def tokens(self) -> int:
        return 2 if self.position == 1 else 1  # (the first pass: the talker's hidden state, then code 0)


class Schedule:
    """The steps of one frame for ``shape`` (a batch size), and the table the kernel reads.

    Per layer: QKV (the input norm's projection) -> ATTN (a request's kv head, once its q/k/v columns
    are written) -> OUT (a split of the attention output, once its heads are done) -> GATE_UP (once the
    residual has every OUT block) -> DOWN (a split of the MLP's inputs, once its GATE_UP columns are
    written); a pass ends with HEAD (once the residual has every DOWN block), SELECT (a part of a request's
    logits -> its best candidates, once the logits are written) and SAMPLE (a request's draw from its parts'
    candidates), whose codes' embeddings are the next pass's input. The residual stream is one buffer:
    OUT's and DOWN's tiles count the parts of each column block they write, and the tile that counts a
    block's last part adds them all to the residual (in fp32, in split order, rounded once as the unsplit
    product) and counts the block reduced (DONE)."""

    def __init__(self, shape: Shape):
        self.shape = shape
        one_pass = [(layer, op) for layer in range(shape.layers) for op in (QKV, ATTN, OUT, GATE_UP, DOWN)]
        one_pass += [(0, HEAD), (0, SELECT), (0, SAMPLE)]
        steps, first = [], 0
        for group in range(shape.groups - 1):  # pass ``group`` (drawing group + 1): its last token at group + 1
            for layer, op in one_pass:
                producer = len(steps) - 1  # (-1: the frame's first step waits for nothing)
                if op == QKV:  # the residual whole: the pass's input, or the layer before's DOWN reduced
                    need = shape.batch if steps and steps[-1].op == SAMPLE else shape.hidden_blocks
                elif op in (GATE_UP, HEAD):
                    need = shape.hidden_blocks
                elif op == SELECT:
                    need = shape.tiles(HEAD)
                else:  # (ATTN, OUT, DOWN, SAMPLE wait for groups of the producer's counters, not its DONE)
                    need = 0
                steps.append(
                    Step(op, shape.tiles(op), layer, group, group + 1, first, producer, need if producer >= 0 else 0)
                )
                first += shape.tiles(op)
        self.steps = steps
        self.num_tiles = first

    def table(self, device) -> torch.Tensor:
        rows = [(s.op, s.tiles, s.layer, s.group, s.position, s.first, s.producer, s.need) for s in self.steps]
        return torch.tensor(rows, dtype=torch.int32, device=device)

    # -- the protocol: what a tile waits for and signals (the kernel does the same) --------------------------------

    def waits(self, index: int, tile: int) -> list[tuple[int, int, int]]:
        """(step, counter, count) tile ``tile`` of step ``index`` waits for before it reads anything."""
        step, s = self.steps[index], self.shape
        if step.producer < 0:
            return []
        if step.op == ATTN:
            j = tile % s.kv_heads
            return [(step.producer, 1 + j, s.qkv_tiles_per_kv_head)]
        if step.op == OUT:
            split = tile // s.hidden_blocks
            return [(step.producer, 1 + j, s.batch) for j in s.kv_heads_of(split)]
        if step.op == DOWN:
            split = tile // s.hidden_blocks
            return [(step.producer, 1 + split, s.gate_up_tiles_of(split))]
        if step.op == SAMPLE:
            return [(step.producer, 1 + tile, s.parts)]
        return [(step.producer, DONE, step.need)]

    def signals(self, index: int, tile: int) -> int:
        """The counter of its own step tile ``tile`` of step ``index`` counts itself in (OUT, DOWN: its
        column block's parts; the tile that counts the last one reduces the block, then counts DONE)."""
        step, s = self.steps[index], self.shape
        if step.op == QKV:
            return 1 + s.kv_head_of(tile)
        if step.op == ATTN:
            return 1 + tile % s.kv_heads
        if step.op == GATE_UP:
            return 1 + tile * s.block_n // s.block_k
        if step.op in (OUT, DOWN):
            return 1 + tile % s.hidden_blocks
        if step.op == SELECT:
            return 1 + tile // s.parts
        return DONE

    # -- the model: what each tile reads and writes -----------------------------------------------------------------

    def regions(self, index: int, tile: int) -> tuple[set, set]:
        """What tile ``tile`` of step ``index`` reads and writes: sets of (buffer, row, column block), the
        column blocks ``block_n`` wide (the residual: ("h", row, block); partial sums: ("part", split, row,
        block); KV: (buffer, layer, request, position, kv head)). The kernel's ops, declared for ``check``."""
        s, p = self.shape, self.steps[index]
        t = p.tokens
        rows = [b * t + i for b in range(s.batch) for i in range(t)]
        last = [b * t + t - 1 for b in range(s.batch)]
        blocks = s.blocks_of(s.hidden)
        cols = lambda name, rs: {(name, r, tile) for r in rs}  # noqa: E731
        residual = lambda rs: {("h", r, c) for r in rs for c in blocks}  # noqa: E731

        if p.op in (QKV, GATE_UP):
            return residual(rows), cols("qkv" if p.op == QKV else "act", rows)
        if p.op == ATTN:
            b, j = divmod(tile, s.kv_heads)
            group = s.heads // s.kv_heads
            own = [b * t + i for i in range(t)]
            head_blocks = lambda first, n: range(first * s.head_dim // s.block_n, (first + n) * s.head_dim // s.block_n)  # noqa: E731
            reads = {("qkv", r, c) for r in own for c in head_blocks(j * group, group)}
            reads |= {("qkv", r, c) for r in own for c in head_blocks(s.heads + j, 1)}
            reads |= {("qkv", r, c) for r in own for c in head_blocks(s.heads + s.kv_heads + j, 1)}
            first = p.position - t + 1
            stored = {(kv, p.layer, b, q, j) for kv in ("k", "v") for q in range(first, p.position + 1)}
            reads |= {(kv, p.layer, b, q, j) for kv in ("k", "v") for q in range(first)}
            writes = {("attn", r, c) for r in own for c in head_blocks(j * group, group)} | stored
            return reads, writes
        if p.op in (OUT, DOWN):
            split, column = divmod(tile, len(blocks))
            width = s.block_k // s.block_n
            name, n = ("attn", s.heads * s.head_dim) if p.op == OUT else ("act", s.intermediate)
            reads = {(name, r, c) for r in rows for c in s.blocks_of(n) if split * width <= c < (split + 1) * width}
            return reads, {("part", split, r, column) for r in rows}
        if p.op == HEAD:
            return residual(last), {("logits", b, tile) for b in range(s.batch)}
        if p.op == SELECT:
            b, part = divmod(tile, s.parts)
            ids = range(part * s.part_width, min((part + 1) * s.part_width, s.vocab))
            return {("logits", b, i // s.block_n) for i in ids}, {("candidates", b, part)}
        b = tile  # SAMPLE: its parts' candidates (the full row's logits where top_k > CANDIDATES)
        writes = {("code", b, p.group), ("total", b, 0)}
        writes |= {("h", b, c) for c in blocks} if p.group < s.groups - 2 else set()
        reads = {("candidates", b, part) for part in range(s.parts)} | {("total", b, 0)}
        return reads | {("logits", b, c) for c in s.blocks_of(s.vocab)}, writes

    def reduction(self, index: int, column: int) -> tuple[set, set]:
        """OUT, DOWN: what the reduction of column block ``column`` reads and writes (run by the tile that
        counts the block's last part: every split's partial sum of it, added to the residual's block)."""
        step = self.steps[index]
        rows = range(self.shape.batch * step.tokens)
        parts = {("part", k, r, column) for k in range(self.shape.splits(step.op)) for r in rows}
        return parts | {("h", r, column) for r in rows}, {("h", r, column) for r in rows}

    def check(self, inputs: set | None = None) -> None:
        """Raise ``ValueError`` unless the waits order every two accesses of one region the way the
        sequential frame (step after step, each OUT / DOWN step's reductions after its tiles) orders them,
        and everything read was written before or is an input (``inputs``: by default the first pass's
        residual rows and the running sum). A wait counts on exactly the tiles (or reductions) that signal
        its counter: its count must be theirs."""
        s = self.shape
        if inputs is None:
            inputs = {("h", r, c) for r in range(s.max_rows) for c in s.blocks_of(s.hidden)}
            inputs |= {("total", b, 0) for b in range(s.batch)}
        nodes, signalers = [], {}  # nodes in sequential order: (name, reads, writes, direct dependencies)
        for index, step in enumerate(self.steps):
            name = f"step {index} ({OPS[step.op]})"
            parts: dict[int, list[int]] = {}
            for tile in range(step.tiles):
                deps = []
                for producer, counter, count in self.waits(index, tile):
                    if producer >= index:
                        raise ValueError(f"{name} tile {tile} waits for a step that is not before it")
                    found = signalers.get((producer, counter), [])
                    if count != len(found):
                        raise ValueError(
                            f"{name} tile {tile} waits for {count} of counter {counter} of step "
                            f"{producer}; {len(found)} signal it"
                        )
                    deps += found
                reads, writes = self.regions(index, tile)
                nodes.append((f"{name} tile {tile}", reads, writes, deps))
                counter = self.signals(index, tile)
                if step.op in (OUT, DOWN):
                    parts.setdefault(counter, []).append(len(nodes) - 1)
                else:
                    signalers.setdefault((index, counter), []).append(len(nodes) - 1)
            for counter, part_nodes in parts.items():  # the reductions: after the block's every part
                signalers[(index, counter)] = part_nodes
                reads, writes = self.reduction(index, counter - 1)
                nodes.append((f"{name} reduction of block {counter - 1}", reads, writes, part_nodes))
                signalers.setdefault((index, DONE), []).append(len(nodes) - 1)
        _check_order(nodes, inputs)


def _check_order(nodes: list, inputs: set) -> None:
    """Every two nodes that touch one region (not both reading it) are ordered by the dependencies, the
    earlier one (in ``nodes``' sequential order) an ancestor of the later; every read was written by an
    earlier node or is an input."""
    ancestors = []
    for _, _, _, deps in nodes:
        mask = 0
        for d in deps:
            mask |= ancestors[d] | (1 << d)
        ancestors.append(mask)
    last_write, reads_since = {}, {}  # region -> its last writer; readers since that write
    for i, (name, reads, writes, _) in enumerate(nodes):
        for region in reads:
            writer = last_write.get(region)
            if writer is None and region not in inputs:
                raise ValueError(f"{name} reads {region}, which nothing wrote before it")
            if writer is not None and not ancestors[i] >> writer & 1:
                raise ValueError(f"{name} reads {region} without waiting for its writer, {nodes[writer][0]}")
        for region in writes:
            for earlier in [last_write.get(region), *reads_since.get(region, ())]:
                if earlier is not None and earlier != i and not ancestors[i] >> earlier & 1:
                    raise ValueError(f"{name} writes {region} without waiting for {nodes[earlier][0]}")
        for region in writes:
            last_write[region], reads_since[region] = i, []
        for region in reads - writes:
            reads_since.setdefault(region, []).append(i)
