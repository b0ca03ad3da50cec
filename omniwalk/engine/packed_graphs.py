"""CUDA graphs of a packed-segment forward (the encoders' layer loops), one per layout bucket.

A packed layout is the host list of segment lengths (attention windows, frame groups) whose
tokens lie back to back; ``cu_seqlens`` marks them (see ``omniwalk.layers.attention``). A graph
has fixed shapes, so a layout is padded to a ``Bucket`` (tokens T, segments S, longest segment M):

    rows        [0, N)                        [N, T)
    tokens      real tokens                   padding (each input's pad value)
    segments    the S' <= S real ones | the padding cut into pieces of <= pad_segment | empty
    cu_seqlens  0 ... N                 | ... T                                        | T T T

Padding tokens attend only among themselves and every other op is row-wise, so real rows are
what the unpadded forward computes (to float rounding: kernels see other row counts). Empty
segments launch attention blocks that exit at once (flash varlen skips them). ``max_seqlen`` is M, a host int
fixed per bucket.

Buckets (``layout_buckets``) are sized from the layouts requests bring: a 5 s clip is 65 audio
tokens in one window of 104, a 448x448 image one segment of 784 patches, a video frame group 512
to 3072 patches. Graphs pay where the encoders are launch-bound (few items a call: one clip takes
nearly as long as 32 eagerly; docs/performance.md):

    tokens    T = 256, 512, ... up to max_tokens
    segments  S = powers of 4, from the fewest segments of at most ``longest`` tokens that hold
              T/2 tokens, up to the first >= T / ``shortest`` (``shortest``: the smallest common
              segment; shorter ones spill into a larger T's buckets)
    longest   M = ``longest`` (audio: one attention window), or min(T, 4 T / S) where segments are
              unbounded (vision), so that segments x longest, the attention launch grid, stays <= 4 T

A layout takes the smallest bucket (T, then S) that holds it; one that fits none runs eagerly and
is counted (``num_eager_calls``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omniwalk.engine.cuda_graphs import KeyedGraphs, StaticInput
from omniwalk.layers.attention import cu_seqlens

MIN_BUCKET_TOKENS = 256
MAX_PAD_SEGMENT = 1024  # padding attends in pieces of at most this many tokens (cost ~ piece * padding)


@dataclass(frozen=True, order=True)
class Bucket:
    num_tokens: int
    num_segments: int  # real segments it holds
    max_seqlen: int  # longest segment it holds (real or padding)

    @property
    def pad_segment(self) -> int:
        return min(self.max_seqlen, MAX_PAD_SEGMENT)

    @property
    def num_slots(self) -> int:
        """Segments in its ``cu_seqlens`` (which has one more entry): real ones, then padding pieces."""
        return self.num_segments + math.ceil(self.num_tokens / self.pad_segment)

    def fits(self, lengths: Sequence[int]) -> bool:
        return (
            sum(lengths) <= self.num_tokens
            and len(lengths) <= self.num_segments
            and max(lengths, default=0) <= self.max_seqlen
        )

    def __str__(self) -> str:
        return f"tokens {self.num_tokens} segments {self.num_segments}"


def layout_buckets(max_tokens: int, longest: int | None, shortest: int, first: int = MIN_BUCKET_TOKENS) -> list[Bucket]:
    """Buckets of ``first`` tokens, twice that, ... up to ``max_tokens`` (0: none) for segments of at
    most ``longest`` tokens (None: any) and commonly at least ``shortest`` (see the module docstring)."""
    buckets, tokens = [], first
    while tokens <= max_tokens:
        segments = 1
        while longest and segments * longest < tokens // 2:  # the fewest that hold T/2 tokens
            segments *= 4
        while True:
            longest_here = min(tokens, longest) if longest else min(tokens, 4 * tokens // segments)
            buckets.append(Bucket(tokens, segments, longest_here))
            if segments * shortest >= tokens:
                break
            segments *= 4
        tokens *= 2
    return buckets


def pick_bucket(buckets: Sequence[Bucket], lengths: Sequence[int]) -> Bucket | None:
    """The smallest bucket that holds the layout, or None."""
    return min((b for b in buckets if b.fits(lengths)), default=None)


def padded_lengths(lengths: Sequence[int], bucket: Bucket) -> list[int]:
    """The bucket's ``num_slots`` segment lengths: the real ones, the padding cut into pieces of
    ``pad_segment`` tokens, then empty segments."""
    full, rest = divmod(bucket.num_tokens - sum(lengths), bucket.pad_segment)
    pieces = [bucket.pad_segment] * full + ([rest] if rest else [])
    out = [*lengths, *pieces]
    return out + [0] * (bucket.num_slots - len(out))


def pad_layout(
    bucket: Bucket, lengths: Sequence[int], rows: dict[str, torch.Tensor], specs: dict[str, StaticInput]
) -> dict[str, torch.Tensor]:
    """The bucket's inputs: every row input (first dimension = packed tokens) padded to
    ``num_tokens`` rows of its pad value, and ``cu_seqlens`` of the padded segments."""
    out = {}
    for name, spec in specs.items():
        x = rows[name]
        pad = x.new_full((bucket.num_tokens - x.shape[0], *x.shape[1:]), spec.pad)
        out[name] = torch.cat([x, pad])
    device = next(iter(out.values())).device
    return {**out, "cu_seqlens": cu_seqlens(padded_lengths(lengths, bucket), device)}


class PackedGraphs:
    """Graphs of ``fn(x..., cu_seqlens, max_seqlen) -> dict of [tokens or fewer, ...]`` over the
    ``buckets``: ``specs`` are its row inputs (per-row shape, dtype, pad value), ``cu_seqlens`` comes
    from the layout. Nothing is captured until ``capture``; before that (or with no buckets) every
    call is eager and uncounted."""

    def __init__(self, name: str, fn: Callable[..., dict], specs: dict[str, StaticInput], buckets, device, knob: str):
        self.name, self.fn, self.specs, self.buckets, self.device, self.knob = name, fn, specs, buckets, device, knob
        self.captured: KeyedGraphs | None = None
        self.num_eager_calls = 0  # calls whose layout fit no bucket while graphs were on

    def capture(self, pool=None):
        if not self.buckets:
            return pool
        self.captured = KeyedGraphs(self.name, self._step, self._capture_inputs, self.buckets, self.device, self.knob)
        return self.captured.capture(pool)

    def _step(self, bucket: Bucket, **inputs) -> dict:
        return self.fn(**inputs, max_seqlen=bucket.max_seqlen)

    def _capture_inputs(self, bucket: Bucket) -> dict[str, torch.Tensor]:
        """All padding: a valid layout to warm up and record on."""
        rows = {k: torch.empty((0, *s.shape), dtype=s.dtype, device=self.device) for k, s in self.specs.items()}
        return pad_layout(bucket, [], rows, self.specs)

    def pick(self, lengths: Sequence[int]) -> Bucket | None:
        """The captured bucket this layout replays in (None: run it eagerly, counted)."""
        if self.captured is None:
            return None
        bucket = pick_bucket(self.buckets, lengths)
        self.num_eager_calls += bucket is None
        return bucket

    def run(self, bucket: Bucket, lengths: Sequence[int], rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Replay the bucket's graph over the padded layout; outputs are static buffers (all rows,
        padding included), valid until that graph's next replay."""
        return self.captured.run(bucket, pad_layout(bucket, lengths, rows, self.specs))

    def stats(self) -> dict:
        return {"graph_replays": self.captured.num_replays if self.captured else 0, "eager_calls": self.num_eager_calls}
