"""MRoPE positions of a prompt (T, H, W rows), equal to HF's ``get_rope_index``.

Computed once per request from the prompt's media spans (never by re-scanning ids), giving
``positions`` [3, prompt_len] (float32: video T positions can be fractional) and ``delta``;
decode token ``i`` (absolute index in the sequence) sits at ``i + delta`` on all three rows.

Layout rules (``p`` = next free position when a segment starts):

    text run        all rows p, p+1, ...
    audio           <|audio_start|> p; pads p+1 ... p+n (all rows); <|audio_end|> max+1
    image / video   <|vision_start|> p; pads T = p+1 + t*seconds_per_grid*pos_per_s (images t=0),
                    H = p+1 + row, W = p+1 + col over the merged grid (row-major per frame);
                    <|vision_end|> = max+1
    audio in video  <|vision_start|><|audio_start|> p, p+1; audio pads p+2+k; video pads as above
                    from p+2; merged in ``interleave_audio_video`` order; the two end tokens
                    continue from the last merged block's max (HF's rule, not the global max)

A segment's successor starts at (max of its last block) + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniwalk.modality import Modality

AUDIO, IMAGE, VIDEO = Modality.AUDIO, Modality.IMAGE, Modality.VIDEO
AUDIO_IN_VIDEO = "audio_in_video"  # a span kind: a video whose audio track's tokens interleave with its frames


@dataclass(frozen=True)
class MediaSpan:
    """A placeholder run in a prompt, sentinels included, starting at token index ``start``.

    ``grid`` is the *merged* grid (frames, rows, cols) = grid_thw // (1, merge, merge).
    """

    kind: str
    start: int
    num_audio: int = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    seconds_per_grid: float = 0.0

    @property
    def num_video(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def length(self) -> int:
        sentinels = 4 if self.kind == AUDIO_IN_VIDEO else 2
        return sentinels + self.num_audio + self.num_video


@dataclass(frozen=True)
class RopePositions:
    positions: torch.Tensor  # [3, prompt_len] float32
    delta: float  # decode position of token i = i + delta

    def decode(self, index: int) -> torch.Tensor:
        """Positions [3, 1] of the token at absolute sequence index ``index`` (>= prompt_len)."""
        return torch.full((3, 1), float(index + self.delta))

    def span(self, start: int, num: int) -> torch.Tensor:
        """Positions [3, num] of absolute indices [start, start + num): prompt rows, then decode rows."""
        prompt_len = self.positions.shape[1]
        head = self.positions[:, start : min(start + num, prompt_len)]
        first, end = max(start, prompt_len), max(start + num, prompt_len)
        tail = torch.arange(first, end, dtype=torch.float32) + self.delta
        return torch.cat([head, tail.expand(3, -1)], dim=1)


def batch_spans(spans: list[tuple[RopePositions, int, int]]) -> torch.Tensor:
    """Positions [3, Σ num] of several requests' (positions, start, num) spans, in order. Decode rows
    (past the prompt: all three sections equal ``index + delta``) are gathered as numbers and made a
    tensor once per run of them: a decode step of B rows costs one small tensor, not B ``span``s."""
    parts, run = [], []
    for rope, start, num in spans:
        if start >= rope.positions.shape[1]:
            run += [start + i + rope.delta for i in range(num)]
            continue
        if run:
            parts.append(torch.tensor(run, dtype=torch.float32).expand(3, -1))
            run = []
        parts.append(rope.span(start, num))
    if run:
        parts.append(torch.tensor(run, dtype=torch.float32).expand(3, -1))
    return torch.cat(parts, dim=1) if parts else torch.zeros(3, 0)


def video_times(grid: tuple[int, int, int], seconds_per_grid: float, pos_per_s: float, truncate=False) -> torch.Tensor:
    """Temporal position offset of each merged video token [t*h*w] (float32, like HF; ``truncate``:
    whole numbers, cut toward zero)."""
    t, h, w = grid
    times = torch.arange(t) * torch.tensor(seconds_per_grid, dtype=torch.float32) * pos_per_s
    return (times.long() if truncate else times).float().repeat_interleave(h * w)


def interleave_audio_video(times: torch.Tensor, num_audio: int) -> list[bool]:
    """Token order of an audio-in-video span: True = next video token, False = next audio token.

    A video token goes first while its time <= the next audio token's index (audio tokens are one
    position apart); the remainder of whichever runs out last follows as one block.
    """
    order, v, a = [], 0, 0
    while v < len(times) and a < num_audio:
        take_video = bool(times[v] <= a)
        order.append(take_video)
        v, a = v + take_video, a + (not take_video)
    order += [True] * (len(times) - v) + [False] * (num_audio - a)
    return order


def vision_block(grid, times: torch.Tensor, start: float) -> torch.Tensor:
    _, h, w = grid
    rows = torch.arange(h).repeat_interleave(w).repeat(grid[0]).float()
    cols = torch.arange(w).repeat(h * grid[0]).float()
    return torch.stack([times, rows, cols]) + start


def _span_blocks(span: MediaSpan, p: float, pos_per_s: float) -> list[torch.Tensor]:
    """Position blocks [3, k] of one span; the last block decides where the next segment starts."""
    if span.kind == AUDIO:
        return [run(p, 1), run(p + 1, span.num_audio), run(p + 1 + span.num_audio, 1)]
    if span.kind in (IMAGE, VIDEO):
        spg = span.seconds_per_grid if span.kind == VIDEO else 1.0
        body = vision_block(span.grid, video_times(span.grid, spg, pos_per_s), p + 1)
        return [run(p, 1), body, run(body.max() + 1, 1)]
    times = video_times(span.grid, span.seconds_per_grid, pos_per_s)
    video, audio = vision_block(span.grid, times, p + 2), run(p + 2, span.num_audio)
    order = torch.tensor(interleave_audio_video(times, span.num_audio), dtype=torch.bool)
    merged = torch.empty(3, len(order))
    merged[:, order], merged[:, ~order] = video, audio
    # HF appends the remainder of the kind that outlasts the other as one final block; it is
    # exactly the trailing same-kind run, and the end sentinels continue from *its* max.
    last = merged[:, len(order) - _trailingrun(order) :]
    return [run(p, 2), merged, run(last.max() + 1, 2)]


def _trailingrun(order: torch.Tensor) -> int:
    flips = (order[1:] != order[:-1]).nonzero()
    return len(order) - (int(flips[-1]) + 1 if len(flips) else 0)


def run(start: float, n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float32) + float(start)).expand(3, n)


def mrope_positions(
    num_tokens: int, spans: list[MediaSpan], position_id_per_seconds: float, span_blocks=None
) -> RopePositions:
    """Positions of a ``num_tokens`` prompt whose media placeholder runs are ``spans``;
    ``span_blocks(span, p, position_id_per_seconds)``: a span's position blocks (default: the rules above).
    With the default rules a prompt of text and audio alone (a voice conversation) is numbered token by
    token on all three rows (each audio span advances one position a token too): made at once, not span by
    span, since the engine makes it for every turn of a conversation."""
    if span_blocks is None and all(span.kind == AUDIO for span in spans):
        _check_spans(num_tokens, spans)
        return RopePositions(torch.arange(num_tokens, dtype=torch.float32).repeat(3, 1), 0.0)
    span_blocks = span_blocks or _span_blocks
    blocks, cursor = [], 0
    for span in _check_spans(num_tokens, spans):
        if span.start > cursor:
            blocks.append(run(_next(blocks), span.start - cursor))
        blocks += span_blocks(span, _next(blocks), position_id_per_seconds)
        cursor = span.start + span.length
    if cursor < num_tokens:
        blocks.append(run(_next(blocks), num_tokens - cursor))
    positions = torch.cat(blocks, dim=1) if blocks else torch.zeros(3, 0)
    delta = float(positions.max()) + 1 - num_tokens if num_tokens else 0.0
    return RopePositions(positions, delta)


def _check_spans(num_tokens: int, spans: list[MediaSpan]) -> list[MediaSpan]:
    """``spans`` in prompt order; ``ValueError`` where one overlaps another or the prompt's end."""
    ordered, cursor = sorted(spans, key=lambda s: s.start), 0
    for span in ordered:
        if span.start < cursor or span.start + span.length > num_tokens:
            raise ValueError(f"media span {span} overlaps another span or the prompt end")
        cursor = span.start + span.length
    return ordered


def _next(blocks: list[torch.Tensor]) -> float:
    return float(blocks[-1].max()) + 1 if blocks else 0.0
