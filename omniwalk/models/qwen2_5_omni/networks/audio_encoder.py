"""Qwen2.5-Omni audio encoder (``thinker.audio_tower``), many clips packed into one call.

    log-mel [B, 128, T] + valid frames per clip
      -> chunks of 2 * n_window frames per clip (the last may be shorter)
      -> conv1 (k3, GELU) -> conv2 (k3, stride 2, GELU) per chunk   [C, d, <= n_window]
      -> + sinusoidal positions 0.. (restarting in every chunk); keep each chunk's valid steps
      -> pre-LN transformer layers, bidirectional inside a chunk      [N, d]
      -> per clip, mean of consecutive pairs (an odd last step dropped) -> ln_post -> proj

Token count per clip: ``audio_output_lengths(num_frames)`` = ((L - 1) // 2 + 1 - 2) // 2 + 1.
Parameter names mirror the checkpoint (``conv1``, ``layers.N.self_attn.q_proj``, ``ln_post``,
``proj``, and ``audio_bos_eos_token``, which the checkpoint holds but the forward never reads).
The layers are the shared Whisper-style ones (``layers/audio_encoder_layer.py``) with a bias-free k_proj.

With the fused kernels (``decoder.use_fused_kernels``, after loading) each conv runs as one GEMM over
its input's windows (time-major, [chunks x steps, kernel x channels]): the same sums as the conv, with
none of cuDNN's layout transforms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.device import to_device
from omniwalk.layers.attention import cu_seqlens
from omniwalk.layers.audio_encoder_layer import AudioEncoderLayer, sinusoid_positions
from omniwalk.layers.linear import MergesProjections
from omniwalk.models.qwen2_5_omni.checkpoint.config import AudioEncoderConfig


def _after_conv(length):
    return (length - 1) // 2 + 1


def audio_output_lengths(num_frames):
    """Audio tokens for ``num_frames`` valid mel frames (int or integer tensor)."""
    return (_after_conv(num_frames) - 2) // 2 + 1


class AudioEncoder(MergesProjections):
    """Encodes packed log-mel clips; see the module docstring for the pipeline."""

    def __init__(self, cfg: AudioEncoderConfig, attention_backend: str = "reference"):
        super().__init__()
        self.cfg, self.attention_backend = cfg, attention_backend
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.audio_bos_eos_token = nn.Embedding(2, cfg.output_dim)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg, key_bias=False) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(d)
        self.proj = nn.Linear(d, cfg.output_dim)
        self.chunk_frames = 2 * cfg.n_window
        self.chunk_tokens = _after_conv(self.chunk_frames)
        self.window_tokens = self.chunk_tokens
        self.register_buffer("positions", sinusoid_positions(cfg.max_source_positions, d), persistent=False)
        self.conv_gemms: tuple[nn.Linear, nn.Linear] | None = None  # the fast path's convs (``merge_projections``)

    def merge_projections(self) -> None:
        """Each conv as a Linear over its windows: weight [out, in, k] read as [out, in * k]."""
        gemms = []
        for conv in (self.conv1, self.conv2):
            out, inp, k = conv.weight.shape
            linear = nn.Linear(inp * k, out, device=conv.weight.device, dtype=conv.weight.dtype)
            linear.weight.data.copy_(conv.weight.reshape(out, inp * k))
            linear.bias.data.copy_(conv.bias)
            gemms.append(linear)
        self.conv_gemms = tuple(gemms)
        del self.conv1, self.conv2

    def output_lengths(self, num_frames: Sequence[int]) -> list[int]:
        return [int(audio_output_lengths(n)) for n in num_frames]

    def segment_lengths(self, num_frames: Sequence[int]) -> list[int]:
        """The attention segments: every chunk's steps after conv2, clip by clip."""
        size = self.chunk_frames
        return [_after_conv(min(size, n - s)) for n in num_frames for s in range(0, n, size)]

    def forward(self, features: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """features [B, num_mel_bins, T] (frames past ``num_frames[b]`` ignored) -> [Σ tokens, output_dim]."""
        x = self.embed(features, num_frames)
        lengths = self.segment_lengths(num_frames)
        x = self.encode(x, cu_seqlens(lengths, x.device), max(lengths))
        return self.finish(x, num_frames)

    def embed(self, features: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """The conv frontend: features -> packed steps [Σ segment lengths, d_model]."""
        chunks, lens = self._chunk(features, num_frames)
        x = chunks.to(self.proj.weight.dtype)
        mask = torch.arange(x.shape[-1], device=x.device) < to_device(lens, x.device, torch.long)[:, None]
        if self.conv_gemms is not None:
            x = F.gelu(_conv_gemm(self.conv_gemms[0], x.transpose(1, 2), 1)) * mask[:, :, None]
            x = F.gelu(_conv_gemm(self.conv_gemms[1], x, 2))  # [C, steps, d]
        else:
            x = F.gelu(self.conv1(x)) * mask[:, None, :]
            x = F.gelu(self.conv2(x)).transpose(1, 2)  # [C, steps, d]
        x = x + self.positions[: x.shape[1]].to(x.dtype)
        steps = x.shape[1]  # each chunk's valid steps, picked by indices made on the host (a mask would sync)
        valid = [c * steps + t for c, n in enumerate(lens) for t in range(_after_conv(n))]
        return x.reshape(-1, x.shape[-1]).index_select(0, to_device(valid, x.device, torch.long))

    def encode(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """The layers over packed steps [N, d_model]: row-wise but for attention inside a chunk, no host
        reads, so it is what a CUDA graph records (over a padded layout)."""
        for layer in self.layers:
            x = layer(x, cu_seqlens, max_seqlen, self.attention_backend)
        return x

    def finish(self, x: torch.Tensor, num_frames: Sequence[int]) -> torch.Tensor:
        """Per clip: pairwise means of its steps -> ln_post -> proj (indices built on the host: eager)."""
        starts, pairs, offset = [], [], 0
        for n in num_frames:
            steps = _after_conv(n)
            count = int(audio_output_lengths(n))
            starts.append(offset)
            pairs.append(count)
            offset += steps
        first = torch.cat([torch.arange(c) * 2 + s for s, c in zip(starts, pairs, strict=True)])
        first = to_device(first, x.device)
        return self.proj(self.ln_post((x[first] + x[first + 1]) / 2))

    def _chunk(self, features: torch.Tensor, num_frames: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """Every clip's valid frames cut into chunks: [C, mel, chunk_frames], their lengths (on the host)."""
        size = self.chunk_frames
        pieces, lens = [], []
        for b, n in enumerate(num_frames):
            if n < 1:
                raise ValueError(f"clip {b} has no mel frames")
            for s in range(0, n, size):
                pieces.append(features[b, :, s : min(s + size, n)])
                lens.append(min(size, n - s))
        longest = max(lens)
        chunks = torch.stack([F.pad(p, (0, longest - p.shape[-1])) for p in pieces])
        return chunks, lens


def _conv_gemm(linear: nn.Linear, x: torch.Tensor, stride: int) -> torch.Tensor:
    """A kernel-3, padding-1 conv over time as one GEMM: x [C, T, in] (time-major) -> [C, T', out].
    The windows' last axis is the kernel tap, so [in, k] flattens as the conv weight [out, in, k] does."""
    windows = F.pad(x, (0, 0, 1, 1)).unfold(1, 3, stride)  # [C, T', in, 3]
    return linear(windows.reshape(*windows.shape[:2], -1))
