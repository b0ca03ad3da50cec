"""The persistent code-predictor kernel's schedule (``kernels/persistent.py``): the phases of a frame, the
table the kernel reads, and the model of what each op's tiles read and write that ``Schedule.check`` proves
the phase order against (the CPU model of the kernel's dependency logic)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

QKV, ATTN, OUT, GATE_UP, DOWN, HEAD, SAMPLE = range(7)
OPS = ("QKV", "ATTN", "OUT", "GATE_UP", "DOWN", "HEAD", "SAMPLE")
COLUMNS = 5  # a phase's row in the table: op, tiles, layer, group, position
BLOCK_N = 16  # output columns of a projection tile (the smallest ``tl.dot`` width)
NORM_K = 256  # inputs a norm's projection tile multiplies at once (its registers: the kernel's largest op)
ROWS = 16  # token rows a tile multiplies at once (a ``tl.dot``'s smallest height; masked past the batch's)


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

    def splits(self, op: int) -> int:
        """OUT and DOWN: the partial sums of a column block (their inputs split ``block_k`` columns a part)."""
        inputs = {OUT: self.heads * self.head_dim, DOWN: self.intermediate}
        return -(-inputs[op] // self.block_k) if op in inputs else 0

    def tiles(self, op: int) -> int:
        columns = {QKV: self.qkv, OUT: self.hidden, GATE_UP: self.intermediate, DOWN: self.hidden, HEAD: self.vocab}
        if op in columns:
            return -(-columns[op] // BLOCK_N) * max(1, self.splits(op))
        return self.batch * self.kv_heads if op == ATTN else self.batch


@dataclass(frozen=True)
class Phase:
    op: int
    tiles: int
    layer: int  # decoder layer (projections, norms, the KV of ATTN)
    group: int  # the head / embedding table index (HEAD: lm_head[group]; SAMPLE: draws group + 1)
    position: int  # rope position of the pass's last token (a pass of two tokens: position - 1 too)

    @property
    def tokens(self) -> int:
        return 2 if self.position == 1 else 1  # (the first pass: the talker's hidden state, then code 0)


class Schedule:
    """The phases of one frame for ``shape`` (a batch size), and the table the kernel reads.

    The residual stream lives in one buffer, ``h``. The output projections (OUT, DOWN) split their inputs:
    each tile writes a partial sum of a column block, and the last of a column block's tiles to finish
    adds them (in fp32, in split order, rounded once as the unsplit product) to the residual's block in
    place (``reduction``). A norm's phase (QKV, GATE_UP, HEAD) then reads the residual alone."""

    def __init__(self, shape: Shape):
        self.shape = shape
        one_pass = [(layer, op) for layer in range(shape.layers) for op in (QKV, ATTN, OUT, GATE_UP, DOWN)]
        one_pass += [(0, HEAD), (0, SAMPLE)]
        # pass ``group`` (drawing group + 1) has its last token at position group + 1
        self.phases = [
            Phase(op, shape.tiles(op), layer, group, group + 1)
            for group in range(shape.groups - 1)
            for layer, op in one_pass
        ]

    def table(self, device) -> torch.Tensor:
        rows = [(p.op, p.tiles, p.layer, p.group, p.position) for p in self.phases]
        return torch.tensor(rows, dtype=torch.int32, device=device)

    def regions(self, phase: Phase, tile: int) -> tuple[set, set]:
        """What tile ``tile`` of ``phase`` reads and writes: sets of (buffer, row, column block), the
        column blocks BLOCK_N wide (the residual: ("h", row, block); partial sums: ("part", split, row,
        block); KV: (buffer, layer, request, position, kv head)). The kernel's ops, declared for ``check``."""
        s, p = self.shape, phase
        t = p.tokens
        rows = [b * t + i for b in range(s.batch) for i in range(t)]
        last = [b * t + t - 1 for b in range(s.batch)]
        blocks = blocks_of(s.hidden)
        cols = lambda name, rs: {(name, r, tile) for r in rs}  # noqa: E731
        residual = lambda rs: {("h", r, c) for r in rs for c in blocks}  # noqa: E731

        if p.op in (QKV, GATE_UP):
            return residual(rows), cols("qkv" if p.op == QKV else "act", rows)
        if p.op == ATTN:
            b, j = divmod(tile, s.kv_heads)
            group = s.heads // s.kv_heads
            own = [b * t + i for i in range(t)]
            head_blocks = lambda first, n: range(first * s.head_dim // BLOCK_N, (first + n) * s.head_dim // BLOCK_N)  # noqa: E731
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
            width = s.block_k // BLOCK_N
            name, n = ("attn", s.heads * s.head_dim) if p.op == OUT else ("act", s.intermediate)
            reads = {(name, r, c) for r in rows for c in blocks_of(n) if split * width <= c < (split + 1) * width}
            return reads, {("part", split, r, column) for r in rows}
        if p.op == HEAD:
            return residual(last), {("logits", b, tile) for b in range(s.batch)}
        b = tile
        writes = {("code", b, p.group), ("total", b, 0)}
        writes |= {("h", b, c) for c in blocks} if p.group < s.groups - 2 else set()
        return {("logits", b, c) for c in blocks_of(s.vocab)} | {("total", b, 0)}, writes

    def reduction(self, phase: Phase, column: int) -> tuple[set, set]:
        """OUT, DOWN: what the reduction of column block ``column`` reads and writes (run by the last of
        the block's tiles to finish: every split's partial sum of it, added to the residual's block)."""
        t = phase.tokens
        rows = range(self.shape.batch * t)
        parts = {("part", k, r, column) for k in range(self.shape.splits(phase.op)) for r in rows}
        return parts | {("h", r, column) for r in rows}, {("h", r, column) for r in rows}

    def check(self, inputs: set | None = None) -> None:
        """Raise ``ValueError`` where a tile reads what a tile of its own phase writes, two tiles of a
        phase write one thing, a phase reads what nothing wrote before it, or a reduction reads a partial
        sum its phase did not write, writes what another reduction writes or a tile of its phase reads
        (``inputs``: what the frame starts with; by default the first pass's residual rows and the
        running sum)."""
        s = self.shape
        if inputs is None:
            inputs = {("h", r, c) for r in range(s.max_rows) for c in blocks_of(s.hidden)}
            inputs |= {("total", b, 0) for b in range(s.batch)}
        written = set(inputs)
        for index, phase in enumerate(self.phases):
            name = f"phase {index} ({OPS[phase.op]})"
            regions = [self.regions(phase, tile) for tile in range(phase.tiles)]
            writes = [w for _, w in regions]
            everything = set().union(*writes)
            if sum(len(w) for w in writes) != len(everything):
                raise ValueError(f"{name}: two tiles write one region")
            for tile, (reads, own) in enumerate(regions):
                if (reads & everything) - own:
                    raise ValueError(f"{name} tile {tile} reads what another tile writes")
                if reads - written - own:
                    raise ValueError(f"{name} tile {tile} reads what nothing wrote before it")
            if phase.op in (OUT, DOWN):
                reduced = [self.reduction(phase, column) for column in blocks_of(s.hidden)]
                tile_reads = set().union(*(reads for reads, _ in regions))
                for column, (reads, own) in enumerate(reduced):
                    if {r for r in reads if r[0] == "part"} - everything or reads - written - everything:
                        raise ValueError(f"{name}: the reduction of block {column} reads what its tiles did not write")
                    if own & tile_reads:
                        raise ValueError(f"{name}: the reduction of block {column} writes what a tile reads")
                reduced_writes = [own for _, own in reduced]
                if sum(len(w) for w in reduced_writes) != len(set().union(*reduced_writes)):
                    raise ValueError(f"{name}: two reductions write one region")
                everything |= set().union(*reduced_writes)
            written |= everything


def blocks_of(n: int) -> range:
    """The BLOCK_N-wide column blocks of n columns."""
    return range(-(-n // BLOCK_N))
