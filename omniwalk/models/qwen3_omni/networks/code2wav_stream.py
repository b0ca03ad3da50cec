"""Exact streaming vocoding: a request's codec frames in, PCM chunks out, nothing lost at boundaries.

``Code2WavState`` is what a stream remembers between chunks, per request:

    attention     the last min(frames, sliding_window - 1) keys/values per layer (RoPE applied)
                  and the frame offset (RoPE positions)
    causal convs  the last ``(kernel - 1) * dilation`` inputs (zeros at stream start = the causal pad)
    trans convs   the last ``kernel / stride - 1`` inputs (none before the first chunk)

A stream decodes each complete chunk (``VocoderStreamConfig``: a small first one, then chunks that
grow to full size; the frames of a last partial chunk when the codes end) with ``Code2Wav.decode``
against its ``Code2WavState``, so every chunk costs work proportional to its new frames (plus a
``sliding_window - 1`` frame attention context) and

    concat(chunks...) == Code2Wav(all frames)     (up to float rounding)

Sample accounting (real config: 1920 samples per frame, lookahead L = 555 samples; s = frames
decoded before the chunk):

    chunk                    frames   samples out     waveform range
    first                    n1       1920·n1 - L     [0, 1920·n1 - L)
    later                    n        1920·n          [1920·s - L, 1920·(s + n) - L)

The last L samples of a chunk need the next frame, so they come out at the start of the next
chunk; nothing more is owed after the last frame, since the one-shot decode of F frames also
ends at 1920·F - L.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omniwalk.errors import ConfigError


@dataclass
class Code2WavState:
    """Stream memory with a leading batch dim B on every tensor (one row per stream).

    A fresh state (``Code2Wav.new_state``) remembers nothing: no attention context, no trans-conv
    inputs. A *pool* (``new_state(n, padded=True)``) has fixed shapes, so batches of its rows
    decode in CUDA graphs: every row keeps ``sliding_window - 1`` attention slots, left-padded
    with zeros and masked by the row's frame count, and its trans-conv inputs. The engine keeps
    every started stream in a pool row: ``gather`` a batch's rows, decode, ``scatter_`` them back.
    """

    num_frames: torch.Tensor  # [B] int64: frames decoded so far (RoPE offset, valid KV slots)
    keys: list[torch.Tensor]  # per layer [B, kv_heads, context, head_dim], RoPE applied; see window_mask
    values: list[torch.Tensor]
    conv: list[torch.Tensor]  # per causal conv [B, C_in, (kernel - 1) * dilation]
    trans: list[torch.Tensor]  # per trans conv [B, C_in, 0 (fresh) | kernel / stride - 1]

    def gather(self, rows: torch.Tensor) -> Code2WavState:
        """The states of rows ``rows`` [b] (int64, on the state's device) as a batch of b."""

        def pick(ts: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t.index_select(0, rows) for t in ts]

        rows_frames = self.num_frames.index_select(0, rows)
        return Code2WavState(rows_frames, pick(self.keys), pick(self.values), pick(self.conv), pick(self.trans))

    def scatter_(self, rows: torch.Tensor, state: Code2WavState) -> None:
        """Write a batch's states into rows ``rows`` of this pool; shorter attention contexts are
        left-padded with zeros (masked: their frames precede the stream's frame 0)."""
        context = self.keys[0].shape[2] if self.keys else 0
        self.num_frames.index_copy_(0, rows, state.num_frames)
        for pool, new in zip(self.keys + self.values, state.keys + state.values, strict=True):
            pool.index_copy_(0, rows, F.pad(new, (0, 0, context - new.shape[2], 0)))
        for pool, new in zip(self.conv + self.trans, state.conv + state.trans, strict=True):
            pool.index_copy_(0, rows, new)


@dataclass(frozen=True)
class VocoderStreamConfig:
    """How a request's frames are cut into vocoder chunks.

    The first chunk has ``first_chunk_frames`` (a small one: earlier first audio). Each later chunk must be
    made while the audio already out plays: with the talker making ``talker_speed`` frames while one plays,
    a chunk after D frames arrives in time if it has at most first + (speed - 1) x D frames (the first
    chunk's audio starts playing when its frames are made, and playback then runs D frames ahead). Each
    later chunk has min(chunk_frames, max(first_chunk_frames, (speed - 1) x D rounded down to a multiple of
    first_chunk_frames)): at speed 2, 5, 5, 10, 20, 25, 25, ... for the defaults (chunks at most double); at
    1.5, 5, 5, 5, 5, 10, 15, ... (a few widths: the multiples of the first). Jumping from the first chunk
    straight to full ones would need chunk_frames / first_chunk_frames x real time (5x for 5 then 25),
    which a large batch of streams does not reach. Full chunks then amortise the per-call cost; the growth
    costs a few smaller calls early in each stream.
    """

    chunk_frames: int = 25
    first_chunk_frames: int = 5
    talker_speed: float = 2.0

    def next_chunk(self, num_decoded_frames: int) -> int:
        """Frames in a stream's next chunk after ``num_decoded_frames`` (the class's schedule)."""
        first = self.first_chunk_frames
        if not num_decoded_frames:
            return first
        ahead = int((self.talker_speed - 1) * num_decoded_frames) // first * first
        return min(self.chunk_frames, max(first, ahead))

    def chunk_kinds(self) -> list[tuple[int, bool]]:
        """Every distinct (frames, fresh) chunk a stream decodes, in schedule order: the first chunk
        (fresh: no state yet), then each later width. A stream decodes only these shapes: every chunk
        but its last has its scheduled width, and a short last chunk is padded to it."""
        kinds, decoded = [(self.first_chunk_frames, True)], self.first_chunk_frames
        while (kind := (self.next_chunk(decoded), False)) not in kinds:  # widths grow, then stay
            kinds.append(kind)
            decoded += kind[0]
        return kinds

    def __post_init__(self):
        for name in ("chunk_frames", "first_chunk_frames"):
            if getattr(self, name) < 1:
                raise ConfigError(f"VocoderStreamConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.talker_speed > 1:  # (at real time or slower no chunk after the first arrives in time)
            raise ConfigError(f"VocoderStreamConfig.talker_speed must be > 1, got {self.talker_speed}")
