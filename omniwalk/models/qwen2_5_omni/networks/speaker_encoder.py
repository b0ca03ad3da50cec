"""The DiT's speaker encoder: ECAPA-TDNN over a voice's reference mel -> a speaker embedding.

HF ``ECAPA_TimeDelayNet`` (module names mirror its state dict, under
``code2wav_dit_model.input_embed.spk_encoder``): a TDNN, SE-Res2Net blocks, the concatenation of
their outputs (multi-layer feature aggregation), attentive statistics pooling, a 1x1 conv. Every
conv keeps the length ('same' padding, reflected). It runs once per voice (``DiT.speaker_rows``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from omniwalk.models.qwen2_5_omni.networks.dit import DiTConfig


class TimeDelayNetBlock(nn.Module):
    """Conv1d ('same' length, reflect padding) + ReLU over [N, C, T]."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(
            in_channels, out_channels, kernel, dilation=dilation, padding="same", padding_mode="reflect"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channel groups; group g > 0 convolves itself plus the previous group's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        width = channels // scale
        self.blocks = nn.ModuleList([TimeDelayNetBlock(width, width, kernel, dilation) for _ in range(scale - 1)])
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        for g in range(1, self.scale):
            parts[g] = self.blocks[g - 1](parts[g] if g == 1 else parts[g] + parts[g - 1])
        return torch.cat(parts, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se_channels, 1)
        self.conv2 = nn.Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SqueezeExcitationRes2NetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, cfg: DiTConfig, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(in_channels, out_channels, 1, 1)
        self.res2net_block = Res2NetBlock(out_channels, cfg.enc_res2net_scale, kernel, dilation)
        self.tdnn2 = TimeDelayNetBlock(out_channels, out_channels, 1, 1)
        self.se_block = SqueezeExcitationBlock(out_channels, cfg.enc_se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _mean_std(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time: x [N, C, T], weights [N, 1 or C, T] summing to 1."""
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    """[N, C, T] -> [N, 2C, 1]: mean and std over time, weighted by an attention over time that
    itself sees each frame beside the utterance's global mean and std."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, t = x.shape
        uniform = torch.ones(n, 1, t, dtype=x.dtype, device=x.device) / t
        mean, std = _mean_std(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _mean_std(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: reference mel [N, T, mel] -> speaker embedding [N, enc_dim]."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        ch, kernels, dilations = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.blocks = nn.ModuleList([TimeDelayNetBlock(cfg.mel_dim, ch[0], kernels[0], dilations[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SqueezeExcitationRes2NetBlock(ch[i - 1], ch[i], cfg, kernels[i], dilations[i]))
        self.mfa = TimeDelayNetBlock(ch[-1], ch[-1], kernels[-1], dilations[-1])  # multi-layer feature aggregation
        self.asp = AttentiveStatisticsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h, outputs = mel.transpose(1, 2), []
        for block in self.blocks:
            h = block(h)
            outputs.append(h)
        h = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)
