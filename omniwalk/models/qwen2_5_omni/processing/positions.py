"""TMRoPE positions of a Qwen2.5-Omni prompt, equal to HF's ``get_rope_index`` (Qwen2.5-Omni).

The layout is the shared one (``models/common/processing/positions.py``: text runs, audio and image
spans, ``RopePositions``) except for video time and audio in video:

    video           T = p+1 + int(t * seconds_per_grid * position_id_per_seconds) (truncated: ``video_times``)
    audio in video  <|vision_bos|><|audio_bos|> both at p; audio pads p+1+k; video pads as above
                    from p+1; merged chunk by chunk: chunk j = the video tokens, then the audio
                    tokens, whose time (position - (p+1)) falls in [j, j+1) * chunk_positions
                    (chunk_positions = int(position_id_per_seconds * seconds_per_chunk)); the two
                    end tokens both at (max of the last merged chunk) + 1
"""

from __future__ import annotations

import torch

from omniwalk.models.common.processing.positions import (
    AUDIO_IN_VIDEO,
    VIDEO,
    MediaSpan,
    RopePositions,
    _span_blocks,
    mrope_positions,
    run,
    video_times,
    vision_block,
)


def chunk_bounds(times: list[float] | torch.Tensor, chunk_positions: int) -> list[tuple[int, int]]:
    """HF's ``get_chunked_index``: (start, end) runs of ``times`` (increasing) per chunk of
    ``chunk_positions``; a chunk that holds no token ends the run before it."""
    bounds, start, chunk = [], 0, 1
    for i, value in enumerate(times):
        if value >= chunk * chunk_positions:
            bounds.append((start, i))
            start, chunk = i, chunk + 1
    return bounds + [(start, len(times))]


def audio_video_order(grid, seconds_per_grid: float, num_audio: int, pos_per_s: float, chunk_seconds: float = 2.0):
    """Token order of an audio-in-video span (True = video): per chunk, its video then its audio tokens."""
    positions = int(pos_per_s * chunk_seconds)
    video = chunk_bounds(video_times(grid, seconds_per_grid, pos_per_s, truncate=True).tolist(), positions)
    audio = chunk_bounds(list(range(num_audio)), positions)
    order = []
    for j in range(max(len(video), len(audio))):
        order += [True] * (video[j][1] - video[j][0] if j < len(video) else 0)
        order += [False] * (audio[j][1] - audio[j][0] if j < len(audio) else 0)
    return order


def span_blocks(span: MediaSpan, p: float, pos_per_s: float, chunk_seconds: float = 2.0) -> list[torch.Tensor]:
    """Position blocks [3, k] of one span (see the module docstring)."""
    if span.kind not in (VIDEO, AUDIO_IN_VIDEO):
        return _span_blocks(span, p, pos_per_s)
    times = video_times(span.grid, span.seconds_per_grid, pos_per_s, truncate=True)
    if span.kind == VIDEO:
        body = vision_block(span.grid, times, p + 1)
        return [run(p, 1), body, run(body.max() + 1, 1)]
    video, audio = vision_block(span.grid, times, p + 1), run(p + 1, span.num_audio)
    positions = int(pos_per_s * chunk_seconds)
    video_chunks = chunk_bounds(times.tolist(), positions)
    audio_chunks = chunk_bounds(list(range(span.num_audio)), positions)
    merged = []
    for j in range(max(len(video_chunks), len(audio_chunks))):
        merged += [video[:, slice(*video_chunks[j])]] if j < len(video_chunks) else []
        merged += [audio[:, slice(*audio_chunks[j])]] if j < len(audio_chunks) else []
    end = merged[-1].max() + 1
    return [run(p, 1), run(p, 1), *merged, run(end, 1), run(end, 1)]


def tmrope_positions(num_tokens: int, spans: list[MediaSpan], pos_per_s: float, chunk_seconds: float) -> RopePositions:
    """Positions of a ``num_tokens`` prompt whose media placeholder runs are ``spans``."""
    blocks = lambda span, p, s: span_blocks(span, p, s, chunk_seconds)  # noqa: E731
    return mrope_positions(num_tokens, spans, pos_per_s, blocks)
