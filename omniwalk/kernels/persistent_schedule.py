"""The persistent code-predictor kernel's schedule (``kernels/persistent.py``): the phases of a frame, the
table the kernel reads, and the model of what each op's tiles read and write that ``Schedule.check`` proves
the phase order against (the CPU model of the kernel's dependency logic)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

QKV, ATTN, OUT, GATE_UP, DOWN, HEAD, SAMPLE = range(7)
OPS = ("QKV", "ATTN", "OUT", "GATE_UP", "DOWN", "HEAD", "SAMPLE")
COLUMNS = 8  # a phase's row in the table: op, tiles, layer, group, position, source, target, parts
BLOCK_N = 16  # output columns of a projection tile (the smallest ``tl.dot`` width)
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
        """Input columns a projection tile multiplies at once, and the share of the output projections'
        inputs each of their tiles takes (their products are split: partial sums, summed by the next norm)."""
        return min(512, 1 << (min(self.hidden, self.heads * self.head_dim, self.intermediate) - 1).bit_length())

    def splits(self, op: int) -> int:
        """OUT and DOWN: the partial sums of a column (their input split ``block_k`` columns a part)."""
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
    source: int = 0  # QKV, GATE_UP, HEAD: the residual buffer (0 or 1) read; SAMPLE: the one the next input goes to
    target: int = -1  # QKV, GATE_UP: the buffer the residual plus the pending partial sums goes to (-1: none)
    parts: int = 0  # QKV, GATE_UP, HEAD: partial sums pending on the residual; OUT, DOWN: the ones written

    @property
    def tokens(self) -> int:
        return 2 if self.position == 1 else 1  # (the first pass: the talker's hidden state, then code 0)


class Schedule:
    """The phases of one frame for ``shape`` (a batch size), and the table the kernel reads.

    The residual stream lives in two buffers: a norm's phase (QKV, GATE_UP, HEAD) reads one, adds the
    partial sums the output projection before it left (OUT's or DOWN's, summed in fp32 and rounded once,
    as the unsplit product) and, where later phases need the sum, writes it to the other."""

    def __init__(self, shape: Shape):
        self.shape = shape
        phases, current, pending = [], 0, 0
        for group in range(shape.groups - 1):  # pass ``group``: its last token at position group + 1
            position = group + 1
            for layer in range(shape.layers):
                at = dict(layer=layer, group=group, position=position)
                for op in (QKV, ATTN, OUT, GATE_UP, DOWN):
                    phase = Phase(op, shape.tiles(op), **at)
                    if op in (QKV, GATE_UP):
                        target = 1 - current if pending else -1
                        phase = Phase(op, shape.tiles(op), **at, source=current, target=target, parts=pending)
                        current, pending = (target if pending else current), 0
                    elif op in (OUT, DOWN):
                        phase = Phase(op, shape.tiles(op), **at, parts=shape.splits(op))
                        pending = shape.splits(op)
                    phases.append(phase)
            at = dict(layer=0, group=group, position=position)
            phases.append(Phase(HEAD, shape.tiles(HEAD), **at, source=current, parts=pending))
            phases.append(Phase(SAMPLE, shape.tiles(SAMPLE), **at, source=current))
            pending = 0
        self.phases = phases

    def table(self, device) -> torch.Tensor:
        rows = [(p.op, p.tiles, p.layer, p.group, p.position, p.source, p.target, p.parts) for p in self.phases]
        return torch.tensor(rows, dtype=torch.int32, device=device)

    def regions(self, phase: Phase, tile: int) -> tuple[set, set]:
        """What tile ``tile`` of ``phase`` reads and writes: sets of (buffer, row, column block), the
        column blocks BLOCK_N wide (the residual buffers: ("h", buffer, row, block); partial sums:
        ("part", part, row, block); KV: (buffer, layer, request, position, kv head)). The kernel's ops,
        declared for ``check``."""
        s, p = self.shape, phase
        t = p.tokens
        rows = [b * t + i for b in range(s.batch) for i in range(t)]
        last = [b * t + t - 1 for b in range(s.batch)]
        blocks = lambda n: range(-(-n // BLOCK_N))  # noqa: E731
        cols = lambda name, rs: {(name, r, tile) for r in rs}  # noqa: E731

        def residual(rs):  # a norm's input: the source buffer's rows and the partial sums pending on them
            reads = {("h", p.source, r, c) for r in rs for c in blocks(s.hidden)}
            return reads | {("part", k, r, c) for k in range(p.parts) for r in rs for c in blocks(s.hidden)}

        if p.op in (QKV, GATE_UP):
            out = cols("qkv" if p.op == QKV else "act", rows)
            if p.target >= 0 and tile < len(blocks(s.hidden)):  # the sum, written by the first tiles a block each
                out |= {("h", p.target, r, tile) for r in rows}
            return residual(rows), out
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
            split, column = divmod(tile, len(blocks(s.hidden)))
            width = s.block_k // BLOCK_N
            name, n = ("attn", s.heads * s.head_dim) if p.op == OUT else ("act", s.intermediate)
            reads = {(name, r, c) for r in rows for c in blocks(n) if split * width <= c < (split + 1) * width}
            return reads, {("part", split, r, column) for r in rows}
        if p.op == HEAD:
            return residual(last), {("logits", b, tile) for b in range(s.batch)}
        b = tile
        writes = {("code", b, p.group), ("total", b, 0)}
        writes |= {("h", p.source, b, c) for c in blocks(s.hidden)} if p.group < s.groups - 2 else set()
        return {("logits", b, c) for c in blocks(s.vocab)} | {("total", b, 0)}, writes

    def check(self, inputs: set | None = None) -> None:
        """Raise ``ValueError`` where a tile reads what a tile of its own phase writes, two tiles of a
        phase write one thing, or a phase reads what nothing wrote before it (``inputs``: what the
        frame starts with; by default the first pass's residual rows, in buffer 0, and the running sum)."""
        s = self.shape
        if inputs is None:
            inputs = {("h", 0, r, c) for r in range(s.max_rows) for c in range(-(-s.hidden // BLOCK_N))}
            inputs |= {("total", b, 0) for b in range(s.batch)}
        written = set(inputs)
        for index, phase in enumerate(self.phases):
            regions = [self.regions(phase, tile) for tile in range(phase.tiles)]
            writes = [w for _, w in regions]
            everything = set().union(*writes)
            if sum(len(w) for w in writes) != len(everything):
                raise ValueError(f"phase {index} ({OPS[phase.op]}): two tiles write one region")
            for tile, (reads, own) in enumerate(regions):
                if (reads & everything) - own:
                    raise ValueError(f"phase {index} ({OPS[phase.op]}) tile {tile} reads what another tile writes")
                if reads - written - own:
                    raise ValueError(f"phase {index} ({OPS[phase.op]}) tile {tile} reads what nothing wrote before it")
            written |= everything
