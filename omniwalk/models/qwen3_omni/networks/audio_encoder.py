"""Qwen3-Omni audio encoder (``thinker.audio_tower``), many clips packed into one call.

    log-mel [B, 128, T] + valid frames per clip
      -> 100-frame chunks [C, 1, 128, 100] -> 3 x (Conv2d stride 2 + GELU) -> [C, ch, 16, 13]
      -> conv_out (Linear ch*16 -> d) + sinusoidal positions 0..12 (restarting in every chunk)
      -> keep each chunk's valid tokens, packed clip by clip        [N, d]
      -> pre-LN transformer layers, bidirectional inside attention windows of
         13 * (n_window_infer // 100) tokens cut per clip (windows never cross clips)
      -> ln_post -> proj1 -> GELU -> proj2                          [N, output_dim]

Token count per clip: ``audio_output_lengths(num_frames)``. Parameter names mirror the
checkpoint (``conv2d1``, ``layers.N.self_attn.q_proj``, ``ln_post``, ``proj2``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.device import to_device
from omniwalk.layers.attention import cu_seqlens
from omniwalk.layers.audio_encoder_layer import AudioEncoderLayer, sinusoid_positions
from omniwalk.models.qwen3_omni.checkpoint.config import AudioEncoderConfig

NUM_CONVS = 3  # each halves time (and mel) with kernel 3, stride 2, padding 1


def _conv_length(length):
    """Output length of one stride-2 conv: ceil(length / 2) (works on ints and tensors)."""
    return (length - 1) // 2 + 1


def audio_output_lengths(num_frames, n_window: int = 50):
    """Audio tokens for ``num_frames`` valid mel frames (int or integer tensor).

    Every full chunk of ``2 * n_window`` frames gives 13 tokens (100 -> 50 -> 25 -> 13); the
    remainder r gives ceil(ceil(ceil(r / 2) / 2) / 2) (0 for r = 0), as HF computes it.
    """
    chunk = 2 * n_window
    tail = num_frames % chunk
    for _ in range(NUM_CONVS):
        tail = _conv_length(tail)
    return tail + (num_frames // chunk) * 13


def attention_windows(num_tokens: Sequence[int], window_tokens: int) -> list[int]:
    """The attention segments, clip by clip: each clip's tokens cut every ``window_tokens``."""
    return [min(window_tokens, n - start) for n in num_tokens for start in range(0, n, window_tokens)]


class AudioEncoder(nn.Module):
    """Encodes packed log-mel clips; see the module docstring for the pipeline."""

    def __init__(self, cfg: AudioEncoderConfig, attention_backend: str = "reference"):
        super().__init__()
        self.cfg, self.attention_backend = cfg, attention_backend
        ch = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        mel_out = cfg.num_mel_bins
        for _ in range(NUM_CONVS):
            mel_out = _conv_length(mel_out)
        self.conv_out = nn.Linear(ch * mel_out, cfg.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.chunk_frames = 2 * cfg.n_window
        self.chunk_tokens = audio_output_lengths(self.chunk_frames, cfg.n_window)
        self.window_tokens = self.chunk_tokens * (cfg.n_window_infer // self.chunk_frames)
        self.register_buffer("positions", sinusoid_positions(self.chunk_tokens, cfg.d_model), persistent=False)

    def output_lengths(self, num_frames: Sequence[int]) -> list[int]:
        return [audio_output_lengths(n, self.cfg.n_window) for n in num_frames]

    def segment_lengths(self, num_frames: Sequence[int]) -> list[int]:
        return attention_windows(self.output_lengths(num_frames), self.window_tokens)

    def forward(self, features: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """features [B, num_mel_bins, T] (frames past ``num_frames[b]`` ignored) -> [Σ tokens, output_dim].

        Rows are clip by clip in input order; ``output_lengths(num_frames)`` gives each clip's rows.
        """
        x = self.embed(features, num_frames)
        lengths = self.segment_lengths(num_frames)
        return self.encode(x, cu_seqlens(lengths, x.device), max(lengths))

    def embed(self, features: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """The conv frontend: features -> packed tokens [Σ tokens, d_model] (no host reads: the valid rows'
        index is built on the host from the lengths; shapes vary with the clips, so not graphed)."""
        chunks, chunk_lens, pad_lens = self._chunk(features, num_frames)
        x = chunks[:, None].to(self.conv2d1.weight.dtype)  # [C, 1, mel, chunk_frames]
        # conv_chunksize bounds the conv activations' memory only
        step = self.cfg.conv_chunksize
        x = torch.cat([self._convs(x[i : i + step], pad_lens[i : i + step]) for i in range(0, x.shape[0], step)])
        num_chunks, ch, mel, steps = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(num_chunks, steps, ch * mel))
        x = x + self.positions[:steps].to(x.dtype)
        kept = [
            c * steps + t for c, n in enumerate(chunk_lens) for t in range(audio_output_lengths(n, self.cfg.n_window))
        ]
        # chunk-major then time: clip order is preserved
        return x.reshape(num_chunks * steps, -1).index_select(0, to_device(kept, x.device, torch.long))

    def encode(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """The layers and the head over packed tokens [N, d_model] -> [N, output_dim]; no host
        reads, so it is what a CUDA graph records (over a padded layout)."""
        for layer in self.layers:
            x = layer(x, cu_seqlens, max_seqlen, self.attention_backend)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))

    @staticmethod
    def finish(x: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """What follows ``encode``: nothing (its head is per token, inside it)."""
        return x

    def _convs(self, x: torch.Tensor, pad_lens: torch.Tensor) -> torch.Tensor:
        """[C, 1, mel, frames] -> [C, ch, mel', steps]; positions past each chunk's padded length act as zeros."""
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            pad_lens = _conv_length(pad_lens)
            x = F.gelu(conv(x))
            # NOTE: HF pads a clip shorter than one chunk only to its own length (so it sees zeros at
            # every conv), but the tail chunk of a longer clip to the full chunk; masking keeps both
            # exact and independent of which other clips share the call.
            x = x * (torch.arange(x.shape[-1], device=x.device) < pad_lens[:, None])[:, None, None, :]
        return x

    def _chunk(self, features: torch.Tensor, num_frames: Sequence[int]):
        """Every clip's valid frames cut into chunks: [C, mel, chunk_frames], lengths (a host list), padded
        lengths [C]."""
        size = self.chunk_frames
        pieces, lens, pads = [], [], []
        for b, n in enumerate(num_frames):
            if n < 1:
                raise ValueError(f"clip {b} has no mel frames")
            starts = range(0, n, size)
            pieces += [features[b, :, s : min(s + size, n)] for s in starts]
            lens += [min(size, n - s) for s in starts]
            pads += [size if n >= size else n] * len(starts)
        chunks = torch.stack([F.pad(p, (0, size - p.shape[-1])) for p in pieces])
        device = features.device
        return chunks, lens, to_device(pads, device, torch.long)
