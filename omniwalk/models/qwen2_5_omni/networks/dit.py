"""The token2wav DiT: the velocity field of a flow-matching ODE from noise to a mel spectrogram.

Network (HF ``Qwen2_5OmniToken2WavDiTModel``, module names mirror its state dict):

    x [N, T, mel]  (noised mel, T = repeats * codec tokens)
      ⊕ speaker rows: ECAPA-TDNN(ref_mel) [enc_dim], the speaker vector ``cond`` [enc_emb_dim]
      ⊕ codec embedding, each token repeated ``repeats`` times        -> proj -> [N, T, hidden]
    -> layers: AdaLN-zero(t) -> block-masked attention (RoPE on head 0 only) -> AdaLN-zero MLP
    -> AdaLN(t) -> proj_out -> velocity [N, T, mel]

Attention is block-local: frame i (block b(i) = i // block_size) sees frame j iff
``-back <= b(j) - b(i) <= ahead``, where ``back`` is 1 in the ``look_backward_layers`` and 0
elsewhere, ``ahead`` likewise. One forward therefore has a receptive field of
``len(look_backward_layers)`` blocks back and ``len(look_ahead_layers)`` ahead (the streaming
windows in ``token2wav_stream.py`` are built from these counts).

Classifier-free guidance runs each row twice: with its conditions, and unconditioned (codec
index 0 everywhere, the ECAPA of an all-zero reference mel, a zero speaker vector). Those rows
are built once per request window (``condition_rows``); ``velocity`` runs both halves in one
batch and mixes them. Rows may have different lengths (padded; padding keys are never attended)
and different times ``t``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.device import to_device
from omniwalk.errors import ConfigError
from omniwalk.layers.linear import MergesProjections, stacked_linear
from omniwalk.layers.rotary import apply_rotary, rope_cos_sin, rotary_tables
from omniwalk.models.json_fields import Section
from omniwalk.models.qwen2_5_omni.networks.speaker_encoder import SpeakerEncoder


@dataclass(frozen=True)
class DiTConfig:
    hidden_size: int = 1024
    num_hidden_layers: int = 22
    num_attention_heads: int = 16
    head_dim: int = 64
    ff_mult: int = 2
    emb_dim: int = 512  # codec embedding width
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768  # the longest mel (frames) one forward may see
    block_size: int = 24  # mel frames per attention block
    look_ahead_layers: tuple[int, ...] = (10,)
    look_backward_layers: tuple[int, ...] = (0, 20)
    repeats: int = 2  # mel frames per codec token
    num_embeds: int = 8193  # codec ids 0..num_embeds (one more row than this)
    mel_dim: int = 80
    enc_emb_dim: int = 192  # the speaker vector ``cond``
    enc_dim: int = 128  # ECAPA output
    enc_channels: tuple[int, ...] = (256, 256, 256, 256, 768)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 64
    enc_res2net_scale: int = 2
    enc_se_channels: int = 64

    def attention_reach(self, layer: int) -> tuple[int, int]:
        """(blocks back, blocks ahead) that ``layer`` attends to."""
        return int(layer in self.look_backward_layers), int(layer in self.look_ahead_layers)


def read_dit_config(s: Section) -> DiTConfig:
    """HF's ``token2wav_config.dit_config``; rope theta from ``rope_parameters`` or ``rope_theta``."""
    rope = s.data.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{s.name('rope_parameters.rope_type')}: only 'default' is supported")
    theta = float(rope.get("rope_theta", s.float("rope_theta", DiTConfig.rope_theta)))
    cfg = s.read(DiTConfig, rope_theta=theta)
    channels = cfg.enc_channels
    if not len(channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations) or len(channels) < 2:
        raise ConfigError(f"{s.name('enc_channels')}, enc_kernel_sizes, enc_dilations: equal lengths >= 2 needed")
    if sum(channels[1:-1]) != channels[-1]:
        raise ConfigError(f"{s.name('enc_channels')}: the last must be the sum of the middle ones, got {channels}")
    if any(c % cfg.enc_res2net_scale for c in channels[:-1]):
        raise ConfigError(f"{s.name('enc_channels')} must be multiples of enc_res2net_scale")
    if cfg.block_size % cfg.repeats:
        raise ConfigError(f"{s.name('block_size')} must be a multiple of repeats (blocks hold whole tokens)")
    if cfg.head_dim % 2:
        raise ConfigError(f"{s.name('head_dim')} must be even (rotary)")
    return cfg


class CodecEmbedding(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.codec_embed = nn.Embedding(cfg.num_embeds + 1, cfg.emb_dim)
        self.repeats = cfg.repeats

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [N, L] -> [N, repeats * L, emb_dim]."""
        return torch.repeat_interleave(self.codec_embed(codes), self.repeats, dim=1)


class InputEmbedding(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.mel_dim + cfg.enc_dim + cfg.enc_emb_dim + cfg.emb_dim, cfg.hidden_size)
        self.spk_encoder = SpeakerEncoder(cfg)

    def forward(self, x: torch.Tensor, conditions: torch.Tensor) -> torch.Tensor:
        """x [N, T, mel] and ``condition_rows`` [N, T, enc_dim + emb_dim + enc_emb_dim] -> [N, T, hidden]."""
        return self.proj(torch.cat((x, conditions), dim=-1))


class TimestepEmbedding(nn.Module):
    """t [N] in [0, 1] -> sinusoids of 1000 t (256 wide) -> MLP -> [N, hidden]."""

    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.ModuleList([nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden)])

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        h = torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)
        for layer in self.time_mlp:
            h = layer(h)
        return h


class AdaLayerNormZero(nn.Module):
    """LayerNorm (no affine) modulated by the time embedding (``adaln_reference``): ``chunks``
    modulation vectors [M, dim] from ``linear(silu(t_emb))``."""

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim * chunks)
        self.chunks = chunks


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int):
        super().__init__()
        # (index 2 is the checkpoint's dropout slot; names must stay ff.0 / ff.3)
        self.ff = nn.Sequential(
            nn.Linear(dim, dim * mult), nn.GELU(approximate="tanh"), nn.Identity(), nn.Linear(dim * mult, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): the checkpoint's interleaved rope pairs
    in rotate-half layout (q and k both, so their dot products are unchanged)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


ADALN_EPS = 1e-6  # the AdaLN-zero LayerNorm's


def adaln_reference(
    h: torch.Tensor, delta: torch.Tensor | None, gate: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """AdaLN-zero: (h + gate * delta, layer_norm(h + gate * delta) * (1 + scale) + shift), h [M, T, H],
    gate/scale/shift [M, H]; the DiT's own order of operations (the oracle of ``kernels/adaln.py``)."""
    if delta is not None:
        h = h + gate.unsqueeze(1) * delta
    return h, F.layer_norm(h, h.shape[-1:], eps=ADALN_EPS) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class Attention(MergesProjections):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        inner = cfg.head_dim * cfg.num_attention_heads
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.to_q = nn.Linear(cfg.hidden_size, inner)
        self.to_k = nn.Linear(cfg.hidden_size, inner)
        self.to_v = nn.Linear(cfg.hidden_size, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, cfg.hidden_size)])
        self.to_qkv: nn.Linear | None = None  # the fused kernels' merged projection (``merge_projections``)
        self.head_rope = None  # and their head-0 rope, in place (``kernels/head_rope.py``)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """x [N, T, hidden]; rope from ``rotary_tables`` [T, 1, head_dim]; mask [N, 1, T, T] (True = attend,
        or additive in x's dtype)."""
        n, t, _ = x.shape
        if self.to_qkv is not None:
            qkv = self.head_rope(self.to_qkv(x), *rope, self.num_heads)
            q, k, v = qkv.view(n, t, 3, self.num_heads, self.head_dim).unbind(2)
        else:
            q, k, v = (proj(x).view(n, t, self.num_heads, self.head_dim) for proj in (self.to_q, self.to_k, self.to_v))
            # NOTE: only head 0 is rotated (so the checkpoint was trained)
            q = torch.cat((apply_rotary(_deinterleave(q[:, :, :1]), *rope), q[:, :, 1:]), dim=2)
            k = torch.cat((apply_rotary(_deinterleave(k[:, :, :1]), *rope), k[:, :, 1:]), dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.to_out[0](out.transpose(1, 2).reshape(n, t, -1))

    def merge_projections(self) -> None:
        """Fused kernels (``decoder.use_fused_kernels``, after loading): q/k/v in one biased GEMM whose head-0
        rows of q and k are stored de-interleaved, then ``head_rope`` rotates head 0 in place."""
        from omniwalk.kernels.head_rope import head_rope_triton

        self.head_rope = head_rope_triton
        d = self.head_dim
        rows = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2), torch.arange(d, self.to_q.out_features)))
        self.to_qkv = stacked_linear(
            [self.to_q.weight[rows], self.to_k.weight[rows], self.to_v.weight],
            [self.to_q.bias[rows], self.to_k.bias[rows], self.to_v.bias],
        )
        self.to_q = self.to_k = self.to_v = None


class DiTBlock(nn.Module):
    """One layer's modules (``DiT.forward`` runs them: the AdaLN-zero residuals carry across blocks)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(cfg.hidden_size, 6)
        self.attn = Attention(cfg)
        self.ff = FeedForward(cfg.hidden_size, cfg.ff_mult)


def block_masks(cfg: DiTConfig, lengths: list[int] | torch.Tensor, total: int, device) -> dict[tuple, torch.Tensor]:
    """(back, ahead) -> [N, 1, T, T] bool attention masks for rows of ``lengths`` padded to ``total``.

    Padding keys are masked; a padding query sees itself too, so no row is all-masked (its
    output is discarded, but must stay finite: attention weights of 0 times NaN values are NaN).
    """
    block = torch.arange(total, device=device) // cfg.block_size
    diff = block[None, :] - block[:, None]  # [query, key]
    lengths = lengths if isinstance(lengths, torch.Tensor) else to_device(lengths, device)  # (a tensor: in a graph)
    valid = torch.arange(total, device=device)[None, :] < lengths[:, None]  # [N, key]
    eye = torch.eye(total, dtype=torch.bool, device=device)
    masks = {}
    for layer in range(cfg.num_hidden_layers):
        reach = cfg.attention_reach(layer)
        if reach not in masks:
            local = (diff >= -reach[0]) & (diff <= reach[1])
            masks[reach] = ((local[None] & valid[:, None, :]) | eye[None]).unsqueeze(1)
    return masks


class DiT(MergesProjections):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.hidden_size)
        self.text_embed = CodecEmbedding(cfg)
        self.input_embed = InputEmbedding(cfg)
        self.transformer_blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm_out = AdaLayerNormZero(cfg.hidden_size, 2)
        self.proj_out = nn.Linear(cfg.hidden_size, cfg.mel_dim)
        self.modulation: nn.Linear | None = None  # the fused kernels' merged modulations (``merge_projections``)
        self.adaln = adaln_reference  # the AdaLN-zero norms (the fused kernels: ``kernels/adaln.py``)

    def speaker_rows(self, cond: torch.Tensor, ref_mel: torch.Tensor) -> torch.Tensor:
        """A speaker's conditions, both CFG halves: cond [enc_emb_dim], ref_mel [T, mel] ->
        [2, enc_dim + enc_emb_dim]: (ECAPA(ref_mel), cond) and (ECAPA(zeros), zeros)."""
        spk = self.input_embed.spk_encoder(torch.stack([ref_mel, torch.zeros_like(ref_mel)]))
        return torch.cat([spk, torch.stack([cond, torch.zeros_like(cond)])], dim=1)

    def condition_rows(self, speaker: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """One window's conditions, both halves: speaker [2, enc_dim + enc_emb_dim] (``speaker_rows``),
        codes [L] -> [2, repeats * L, enc_dim + emb_dim + enc_emb_dim] in HF's concatenation order."""
        frames = codes.shape[0] * self.cfg.repeats
        code_rows = self.text_embed(torch.stack([codes, torch.zeros_like(codes)]))  # uncond: codec index 0
        enc, spk = speaker[:, None, : self.cfg.enc_dim], speaker[:, None, self.cfg.enc_dim :]
        return torch.cat([enc.expand(-1, frames, -1), code_rows, spk.expand(-1, frames, -1)], dim=-1)

    def run_in(self, dtype: torch.dtype) -> None:
        """Run the per-step layers (input projection, blocks, output norm and projection) in ``dtype``;
        the ODE state and velocity, the time, codec and speaker embeddings stay fp32 (``forward``)."""
        for module in (self.input_embed.proj, self.transformer_blocks, self.norm_out, self.proj_out):
            module.to(dtype)

    def forward(self, x: torch.Tensor, t: torch.Tensor, conditions: torch.Tensor, masks) -> torch.Tensor:
        """x [M, T, mel], t [M], conditions [M, T, ...], masks from ``block_masks`` -> [M, T, mel] in x's
        dtype (the layers' dtype, ``run_in``, inside)."""
        dtype = self.proj_out.weight.dtype
        t_emb = self.time_embed(t).to(dtype)
        h = self.input_embed(x.to(dtype), conditions.to(dtype))
        cos, sin = rope_cos_sin(torch.arange(x.shape[1], device=x.device), self.cfg.head_dim, self.cfg.rope_theta)
        rope = rotary_tables(cos, sin, dtype)
        *layers, (scale, shift) = self._modulations(t_emb)
        adaln = self.adaln
        if self.modulation is not None:  # (sdpa's own conversion of a bool mask, once a forward, not a layer)
            masks = {
                k: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, -math.inf)
                for k, m in masks.items()
            }
        delta = gate = None  # the previous sub-block's output and gate: its residual add is the next norm's
        for i, (block, (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp)) in enumerate(
            zip(self.transformer_blocks, layers, strict=True)
        ):
            h, a = adaln(h, delta, gate, scale_msa, shift_msa)
            h, f = adaln(h, block.attn(a, rope, masks[self.cfg.attention_reach(i)]), gate_msa, scale_mlp, shift_mlp)
            delta, gate = block.ff(f), gate_mlp
        return self.proj_out(adaln(h, delta, gate, scale, shift)[1]).to(x.dtype)

    def _modulations(self, t_emb: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Each block's six modulation vectors (shift, scale, gate of attention, then of the MLP), then
        the output norm's (scale, shift): [M, hidden] each (views of one product when merged)."""
        norms = [block.attn_norm for block in self.transformer_blocks] + [self.norm_out]
        act = F.silu(t_emb)
        if self.modulation is None:
            return [torch.chunk(norm.linear(act), norm.chunks, dim=1) for norm in norms]
        merged, start = self.modulation(act), 0
        out = []
        for norm in norms:
            out.append(torch.chunk(merged[:, start : start + norm.chunks * self.cfg.hidden_size], norm.chunks, dim=1))
            start += norm.chunks * self.cfg.hidden_size
        return out

    def merge_projections(self) -> None:
        """Fused kernels (``decoder.use_fused_kernels``, after loading and ``run_in``): the time embedding's
        23 modulation GEMMs (each block's six vectors, the output norm's two) become one, and the
        AdaLN-zero norms run as ``adaln_triton`` (a kernel each, the gated residual add folded in);
        ``Attention`` merges its own projections."""
        from omniwalk.kernels.adaln import adaln_triton

        self.adaln = adaln_triton
        norms = [block.attn_norm for block in self.transformer_blocks] + [self.norm_out]
        self.modulation = stacked_linear([n.linear.weight for n in norms], [n.linear.bias for n in norms])
        for norm in norms:
            norm.linear = None

    def velocity(self, x, t, conditions, masks, guidance_scale: float) -> torch.Tensor:
        """The guided velocity of N rows: x [N, T, mel], t [N], conditions [2N, T, ...] (all
        conditioned rows, then all unconditioned), masks for 2N rows -> [N, T, mel]."""
        out = self(torch.cat([x, x]), torch.cat([t, t]), conditions, masks)
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * guidance_scale
