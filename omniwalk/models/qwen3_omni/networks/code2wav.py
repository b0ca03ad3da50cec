"""Code2Wav: codec frames -> 24 kHz mono waveform, decoded one-shot or as an exact stream.

Network (reference §6): the mean of a frame's Q code embeddings -> a causal sliding-window
transformer -> 2 x (transposed conv x2 + ConvNeXt) -> a causal conv decoder of SnakeBeta /
transposed-conv / dilated residual blocks -> clamp to [-1, 1].

Every stage is causal except the trimmed transposed convs of kernel 2r and stride r, whose output
block m needs input m+1: F frames give ``samples_per_frame * F - 555`` samples (real config), and
those samples never change when more frames follow. ``decode(codes, state)`` therefore decodes new
frames exactly, given a ``Code2WavState`` (code2wav_stream.py) that remembers each request's
attention keys/values and the left context of every convolution.

The one-shot ``forward`` is ``decode`` from a fresh state, so a stream and a one-shot decode differ
only by float rounding. Module names mirror the checkpoint's ``code2wav.*`` names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import sdpa_kernel

from omniwalk.layers.kv_attention import SDPA_BACKENDS
from omniwalk.layers.moe import GatedMLP
from omniwalk.layers.norm import RMSNorm
from omniwalk.layers.rotary import apply_rotary, rope_cos_sin, rotary_tables
from omniwalk.models.qwen3_omni.checkpoint.config import Code2WavConfig
from omniwalk.models.qwen3_omni.networks.code2wav_stream import Code2WavState


class SnakeBeta(nn.Module):
    """``x + sin(x * e^alpha)^2 / (e^beta + 1e-9)`` per channel; alpha, beta are stored as logs."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, state: Code2WavState | None = None) -> torch.Tensor:
        alpha, beta = self.alpha.exp()[:, None], self.beta.exp()[:, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class CausalConv(nn.Module):
    """Conv1d over [B, C, T] that sees only the past; ``slot`` indexes ``Code2WavState.conv``."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation
        self.slot = -1

    def forward(self, x: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        x = torch.cat([state.conv[self.slot], x], dim=-1)
        state.conv[self.slot] = x[..., x.shape[-1] - self.context :].clone()
        return self.conv(x)


class CausalTransConv(nn.Module):
    """ConvTranspose1d(kernel, stride) with ``kernel - stride`` samples trimmed on both sides.

    For kernel = h·stride + stride, output block m (``stride`` samples) depends on inputs m..m+h,
    so a stream holds the last h inputs and emits one block per new input (h fewer at the start).
    ``slot`` indexes ``Code2WavState.trans``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int):
        super().__init__()
        if kernel % stride:
            raise ValueError(f"kernel {kernel} must be a multiple of stride {stride}")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel, stride)
        self.trim = kernel - stride
        self.hold = kernel // stride - 1
        self.slot = -1

    def forward(self, x: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        x = torch.cat([state.trans[self.slot], x], dim=-1)
        state.trans[self.slot] = x[..., x.shape[-1] - self.hold :].clone()
        y = self.conv(x)
        return y[..., self.trim : y.shape[-1] - self.trim]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)), state)


class DecoderBlock(nn.Module):
    """SnakeBeta -> upsample x``rate`` (trans conv, kernel 2·rate) -> residual units (dilation 1, 3, 9)."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units = [ResidualUnit(out_dim, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalTransConv(in_dim, out_dim, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class WindowAttention(nn.Module):
    """Causal attention over the last ``sliding_window`` frames (the query's own included)."""

    def __init__(self, cfg: Code2WavConfig, layer: int):
        super().__init__()
        self.layer, self.head_dim, self.window = layer, cfg.head_dim, cfg.sliding_window
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, state: Code2WavState) -> torch.Tensor:
        """x [B, T, hidden]; cos/sin [B, T, head_dim]; mask [B, 1, T, context + T] (True = attend)."""
        b, t, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, t, -1, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rotary(self.k_proj(x).view(b, t, -1, self.head_dim), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = torch.cat([state.keys[self.layer], k], dim=2)
        v = torch.cat([state.values[self.layer], v], dim=2)
        keep = min(k.shape[2], self.window - 1)  # the next chunk's first frame sees window - 1 earlier frames
        state.keys[self.layer] = k[:, :, k.shape[2] - keep :].clone()
        state.values[self.layer] = v[:, :, v.shape[2] - keep :].clone()
        with sdpa_kernel(SDPA_BACKENDS):  # chunks change the key length every call (see kv_attention)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads
            )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig, layer: int):
        super().__init__()
        self.self_attn = WindowAttention(cfg, layer)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, h, cos, sin, mask, state: Code2WavState) -> torch.Tensor:
        h = h + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(h), cos, sin, mask, state))
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h)))


class Code2WavTransformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([TransformerLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        """h [B, T, hidden] for frames ``num_frames .. num_frames + T`` of each row."""
        positions = state.num_frames[:, None] + torch.arange(h.shape[1], device=h.device)
        cos, sin = rope_cos_sin(positions.flatten(), self.cfg.head_dim, self.cfg.rope_theta)
        cos, sin = rotary_tables(cos.view(*positions.shape, -1), sin.view(*positions.shape, -1), h.dtype)
        context = state.keys[0].shape[2] if state.keys else 0
        mask = window_mask(state.num_frames, context, h.shape[1], self.cfg.sliding_window)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state)
        return self.norm(h)


def window_mask(num_frames: torch.Tensor, context: int, num_new: int, window: int) -> torch.Tensor:
    """[B, 1, T, C+T] bool (True = attend): keys are C remembered slots, then the T new frames.

    Slot s of a row at frame offset n holds frame ``n - C + s``; query q (frame n + q) sees key frame
    j iff ``n + q - W < j <= n + q`` and ``j >= 0``. A stream remembers C = min(n, W - 1) frames, so
    the last condition only matters when rows of different offsets are batched with left-padded KV.
    """
    device = num_frames.device
    query = torch.arange(num_new, device=device)[:, None]
    slot = torch.arange(context + num_new, device=device)[None, :]
    offset = slot - context - query  # key frame minus query frame
    in_window = (offset <= 0) & (offset > -window)
    started = slot[None] >= context - num_frames[:, None, None]
    return (in_window[None] & started).unsqueeze(1)


class Code2Wav(nn.Module):
    """Codes [B, F, Q] (frame-major, as the talker emits them) -> waveform [B, N] float in [-1, 1]."""

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.cfg = cfg
        hidden, dim = cfg.hidden_size, cfg.decoder_dim
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size)
        offsets = torch.arange(cfg.num_quantizers) * cfg.codebook_size  # quantizer q owns rows q·codebook..
        self.register_buffer("code_offset", offsets, persistent=False)
        self.pre_transformer = Code2WavTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(hidden, hidden, r, r), ConvNeXtBlock(hidden)]) for r in cfg.upsampling_ratios
        )
        blocks = [DecoderBlock(dim >> i, dim >> (i + 1), r) for i, r in enumerate(cfg.upsample_rates)]
        out_dim = dim >> len(cfg.upsample_rates)
        self.decoder = nn.ModuleList(
            [CausalConv(hidden, dim, 7), *blocks, SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        )
        # Module order is forward order, so slots number the stream state in the order it is used.
        self._convs = [m for m in self.modules() if isinstance(m, CausalConv)]
        self._trans = [m for m in self.modules() if isinstance(m, CausalTransConv)]
        for i, m in enumerate(self._convs):
            m.slot = i
        for i, m in enumerate(self._trans):
            m.slot = i

    def num_samples(self, num_frames: int) -> int:
        """Waveform length of a one-shot decode of ``num_frames`` frames (1920·F - 555 for the real config)."""
        n = num_frames
        for r in self.cfg.upsampling_ratios:
            n *= r
        for r in self.cfg.upsample_rates:
            n = (n - 1) * r
        return n

    def new_state(self, batch_size: int = 1, padded: bool = False) -> Code2WavState:
        """The memory of ``batch_size`` streams that have decoded nothing yet; ``padded``: a pool
        of fixed-shape rows for started streams (see ``Code2WavState``)."""
        p = self.code_embedding.weight
        cfg = self.cfg

        def zeros(*shape):
            return torch.zeros(batch_size, *shape, dtype=p.dtype, device=p.device)

        kv_shape = (cfg.num_key_value_heads, cfg.sliding_window - 1 if padded else 0, cfg.head_dim)
        return Code2WavState(
            num_frames=torch.zeros(batch_size, dtype=torch.long, device=p.device),
            keys=[zeros(*kv_shape) for _ in range(cfg.num_hidden_layers)],
            values=[zeros(*kv_shape) for _ in range(cfg.num_hidden_layers)],
            conv=[zeros(m.conv.in_channels, m.context) for m in self._convs],
            trans=[zeros(m.conv.in_channels, m.hold if padded else 0) for m in self._trans],
        )

    def decode(self, codes: torch.Tensor, state: Code2WavState) -> torch.Tensor:
        """Decode the next frames of each row, updating ``state``.

        codes [B, T, Q] int -> [B, samples_per_frame·T] float (555 fewer on a fresh state, real config).
        """
        if codes.shape[1] == 0:
            raise ValueError("decode needs at least one frame")
        h = self.code_embedding(codes + self.code_offset).mean(dim=2)
        h = self.pre_transformer(h, state).transpose(1, 2)  # [B, hidden, T]
        state.num_frames = state.num_frames + codes.shape[1]
        for stage in self.upsample:
            for block in stage:
                h = block(h, state)
        for block in self.decoder:
            h = block(h, state)
        return h.clamp(-1, 1).squeeze(1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """One-shot decode: codes [B, F, Q] -> [B, num_samples(F)]."""
        return self.decode(codes, self.new_state(codes.shape[0]))
