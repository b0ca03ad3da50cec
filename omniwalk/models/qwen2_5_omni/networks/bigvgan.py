"""BigVGAN: mel spectrogram [N, mel, T] -> 24 kHz waveform [N, T * samples_per_frame] in [-1, 1].

Network (HF ``Qwen2_5OmniToken2WavBigVGANModel``, module names mirror its state dict): the log
mel is mapped to a normalised dB scale, then conv_pre -> per stage: a transposed conv upsampling
by ``upsample_rates[i]``, the mean of AMP blocks (dilated convs with anti-aliased SnakeBeta:
upsample x2, Snake, low-pass, downsample x2) -> anti-aliased Snake -> conv_post -> clamp.

Every conv is centred (not causal), so a sample depends on the mel frames around it, within
``receptive_field_frames`` either side (an upper bound computed from the config: 38 frames for
the 7B config, whose measured reach with random weights is 30 frames, changes past 20 frames
being < 1e-5 of a unit change of the frame). A stream that decodes each span of frames with
that many frames of real context on both sides (trimming their samples) reproduces a one-shot
decode to float rounding; at the utterance's ends the one-shot's replicate padding is what the
stream sees too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.errors import ConfigError
from omniwalk.models.json_fields import Section

ANTI_ALIAS_KERNEL = 12  # taps of the x2 up/down-sampling low-pass filters (on the x2 grid)


@dataclass(frozen=True)
class BigVGANConfig:
    mel_dim: int = 80
    upsample_initial_channel: int = 1536
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (5, 3, 2, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (11, 7, 4, 4, 4, 4)

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates)

    def receptive_field_frames(self) -> int:
        """Mel frames either side of a sample's own frame that it may depend on (an upper bound)."""
        reach, rate = 3.0, 1  # conv_pre (kernel 7), in frames
        for r, k in zip(self.upsample_rates, self.upsample_kernel_sizes, strict=True):
            reach += (max(k - 1 - (k - r) // 2, (k - r) // 2) // r + 1) / rate  # transposed conv, input frames
            rate *= r
            blocks = zip(self.resblock_kernel_sizes, self.resblock_dilation_sizes, strict=True)
            reach += max(_amp_block_reach(kernel, dilations) for kernel, dilations in blocks) / rate
        return math.ceil(reach + (_SNAKE_REACH + 3) / rate)  # activation_post, conv_post (kernel 7)


# Samples either side an anti-aliased Snake reads: the x2 upsampling reads 3 input samples a side,
# the low-pass before decimation 5.5 x2-grid samples, i.e. 3 more.
_SNAKE_REACH = ANTI_ALIAS_KERNEL // 2


def _amp_block_reach(kernel: int, dilations: tuple[int, ...]) -> int:
    """Samples either side an AMP block reads: per pair, two Snakes, a dilated and a plain conv."""
    return sum(2 * _SNAKE_REACH + (kernel - 1) * d // 2 + (kernel - 1) // 2 for d in dilations)


def read_bigvgan_config(s: Section) -> BigVGANConfig:
    dilations = s.get("resblock_dilation_sizes", BigVGANConfig.resblock_dilation_sizes, (list, tuple))
    if not all(isinstance(d, (list, tuple)) and len(d) == 3 and all(isinstance(x, int) for x in d) for d in dilations):
        raise ConfigError(f"{s.name('resblock_dilation_sizes')} must be lists of 3 integers, got {dilations!r}")
    cfg = s.read(BigVGANConfig, resblock_dilation_sizes=tuple(tuple(d) for d in dilations))
    if len(cfg.resblock_kernel_sizes) != len(cfg.resblock_dilation_sizes):
        raise ConfigError(f"{s.name('resblock_kernel_sizes')} and resblock_dilation_sizes must have equal lengths")
    if len(cfg.upsample_rates) != len(cfg.upsample_kernel_sizes):
        raise ConfigError(f"{s.name('upsample_rates')} and upsample_kernel_sizes must have equal lengths")
    if any((k - r) % 2 for r, k in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)):
        raise ConfigError(f"{s.name('upsample_kernel_sizes')}: kernel - rate must be even (whole samples per frame)")
    if cfg.upsample_initial_channel % 2 ** len(cfg.upsample_rates):
        raise ConfigError(f"{s.name('upsample_initial_channel')} must be divisible by 2^len(upsample_rates)")
    return cfg


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel: int) -> torch.Tensor:
    """A Kaiser-windowed sinc low-pass filter [1, 1, kernel] summing to 1 (cutoff in cycles per sample)."""
    half = kernel // 2
    transition = 4 * half_width
    attenuation = 2.285 * (half - 1) * math.pi * transition + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel, beta=beta, periodic=False, dtype=torch.float32)
    time = torch.arange(-half, half) + 0.5 if kernel % 2 == 0 else torch.arange(kernel) - half
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (taps / taps.sum()).view(1, 1, kernel)


class SnakeBeta(nn.Module):
    """``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)`` per channel of [N, C, T]."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = self.alpha.exp()[None, :, None], self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class AntiAliasedSnake(nn.Module):
    """SnakeBeta at twice the sample rate: upsample x2 (low-pass), Snake, low-pass + decimate x2."""

    def __init__(self, channels: int):
        super().__init__()
        self.act = SnakeBeta(channels)
        # low-pass at half the input's Nyquist, on the x2 grid (non-persistent: not in the checkpoint)
        self.register_buffer("lowpass", kaiser_sinc_filter(0.25, 0.3, ANTI_ALIAS_KERNEL), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels, k = x.shape[1], ANTI_ALIAS_KERNEL
        taps = self.lowpass.expand(channels, -1, -1)
        pad = k // 2 - 1  # upsample: replicate-pad, transposed conv, trim to exactly 2x
        trim = pad * 2 + (k - 2) // 2
        up = 2 * F.conv_transpose1d(F.pad(x, (pad, pad), mode="replicate"), taps, stride=2, groups=channels)
        up = self.act(up[..., trim : up.shape[-1] - trim])
        return F.conv1d(F.pad(up, (k // 2 - 1, k // 2), mode="replicate"), taps, stride=2, groups=channels)


class AMPBlock(nn.Module):
    """Three residual pairs: Snake -> dilated conv -> Snake -> conv, each added to its input."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel - 1) * d // 2) for d in dilations]
        )
        self.convs2 = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in dilations]
        )
        self.activations = nn.ModuleList([AntiAliasedSnake(channels) for _ in range(2 * len(dilations))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2, strict=True)):
            x = x + conv2(self.activations[2 * i + 1](conv1(self.activations[2 * i](x))))
        return x


class BigVGAN(nn.Module):
    def __init__(self, cfg: BigVGANConfig):
        super().__init__()
        self.cfg = cfg
        ch = cfg.upsample_initial_channel
        self.conv_pre = nn.Conv1d(cfg.mel_dim, ch, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ModuleList([nn.ConvTranspose1d(ch >> i, ch >> (i + 1), k, r, padding=(k - r) // 2)])
            for i, (r, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True))
        )
        self.resblocks = nn.ModuleList(
            AMPBlock(ch >> (i + 1), kernel, dilations)
            for i in range(len(cfg.upsample_rates))
            for kernel, dilations in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)
        )
        out_ch = ch >> len(cfg.upsample_rates)
        self.activation_post = AntiAliasedSnake(out_ch)
        self.conv_post = nn.Conv1d(out_ch, 1, 7, padding=3, bias=False)

    @staticmethod
    def normalized_db(mel: torch.Tensor) -> torch.Tensor:
        """Natural-log mel -> dB (floored at -115 dB, minus 20 dB) -> linear map of [-115, 0] dB to [-1, 1]."""
        # HF's floor (exp of a tensor in mel's dtype), computed on the host: graph capture allows no upload.
        floor = torch.exp(torch.tensor(-115 / 20.0 * math.log(10), dtype=mel.dtype)).item()
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=floor)) - 20
        return torch.clamp(2 * ((db - -115) / 115) - 1, -1, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [N, mel_dim, T] -> waveform [N, T * samples_per_frame]."""
        h = self.conv_pre(self.normalized_db(mel))
        per_stage = len(self.cfg.resblock_kernel_sizes)
        for i, (up,) in enumerate(self.ups):
            h = up(h)
            h = sum(self.resblocks[i * per_stage + j](h) for j in range(per_stage)) / per_stage
        return torch.clamp(self.conv_post(self.activation_post(h)), min=-1.0, max=1.0).squeeze(1)
