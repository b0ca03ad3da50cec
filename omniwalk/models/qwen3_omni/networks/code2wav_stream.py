"""Exact streaming vocoding: a request's codec frames in, PCM chunks out, nothing lost at boundaries.

``Code2WavState`` is what a stream remembers between chunks, per request:

    attention     the last min(frames, sliding_window - 1) keys/values per layer (RoPE applied)
                  and the frame offset (RoPE positions)
    causal convs  the last ``(kernel - 1) * dilation`` inputs (zeros at stream start = the causal pad)
    trans convs   the last ``kernel / stride - 1`` inputs (none before the first chunk)

A ``VocoderStream`` buffers frames until a chunk is complete and decodes it with ``Code2Wav.decode``
against the request's ``Code2WavState``, so every chunk costs work proportional to its new frames
(plus a ``sliding_window - 1`` frame attention context) and

    concat(push(...) chunks..., finish()) == Code2Wav(all frames)     (up to float rounding)

Sample accounting (real config: 1920 samples per frame, lookahead L = 555 samples; s = frames
decoded before the chunk):

    chunk                    frames   samples out     waveform range
    first (push / finish)    n1       1920·n1 - L     [0, 1920·n1 - L)
    later (push / finish)    n        1920·n          [1920·s - L, 1920·(s + n) - L)

The last L samples of a chunk need the next frame, so they come out at the start of the next
chunk. ``finish`` decodes the frames of a last partial chunk; nothing more is owed after the
last frame, since the one-shot decode of F frames also ends at 1920·F - L.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from omniwalk.errors import ConfigError

if TYPE_CHECKING:  # code2wav.py imports this module for Code2WavState
    from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav


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

    A small first chunk lowers time to first audio; larger later chunks amortise per-call cost.
    """

    chunk_frames: int = 25
    first_chunk_frames: int = 5

    def next_chunk(self, num_decoded_frames: int) -> int:
        """Frames in a stream's next chunk: the (smaller) first chunk, then full chunks."""
        return self.chunk_frames if num_decoded_frames else self.first_chunk_frames

    def __post_init__(self):
        for name in ("chunk_frames", "first_chunk_frames"):
            if getattr(self, name) < 1:
                raise ConfigError(f"VocoderStreamConfig.{name} must be >= 1, got {getattr(self, name)}")


class VocoderStream:
    """One request's streaming vocoder. Not thread-safe; one instance per request."""

    def __init__(self, vocoder: Code2Wav, config: VocoderStreamConfig = VocoderStreamConfig()):
        self.vocoder, self.config = vocoder, config
        self.state = vocoder.new_state(batch_size=1)
        self.num_decoded_frames = 0
        self._pending: list[torch.Tensor] = []  # frames [T_i, Q] received but not decoded yet

    @property
    def num_pending_frames(self) -> int:
        return sum(len(f) for f in self._pending)

    def _next_chunk_frames(self) -> int:
        return self.config.next_chunk(self.num_decoded_frames)

    @torch.inference_mode()
    def push(self, frames: torch.Tensor) -> list[torch.Tensor]:
        """Add codec frames [T, Q] (T >= 0); return the PCM chunks [samples] float32 now complete."""
        self._pending.append(frames)
        chunks = []
        while self.num_pending_frames >= self._next_chunk_frames():
            chunks.append(self._decode(self._next_chunk_frames()))
        return chunks

    @torch.inference_mode()
    def finish(self) -> torch.Tensor:
        """Decode the frames of a last partial chunk (possibly none: an empty tensor)."""
        if not self.num_pending_frames:
            return torch.zeros(0, dtype=torch.float32)
        return self._decode(self.num_pending_frames)

    def _decode(self, num_frames: int) -> torch.Tensor:
        frames = torch.cat(self._pending)
        self._pending = [frames[num_frames:]]
        device = self.vocoder.code_embedding.weight.device
        wav = self.vocoder.decode(frames[None, :num_frames].to(device), self.state)
        self.num_decoded_frames += num_frames
        return wav[0].float()


def decode_in_chunks(vocoder: Code2Wav, codes: torch.Tensor, chunk_frames: int = 300) -> torch.Tensor:
    """One-shot equivalent of ``vocoder(codes[None])[0]`` for codes [F, Q] with memory bounded by
    ``chunk_frames`` (attention over all F frames at once grows as F²)."""
    stream = VocoderStream(vocoder, VocoderStreamConfig(chunk_frames=chunk_frames, first_chunk_frames=chunk_frames))
    return torch.cat([*stream.push(codes), stream.finish()])
