"""Token2Wav: talker codec ids -> 24 kHz waveform, by a flow-matching DiT and a BigVGAN vocoder.

    codes [L] ──► DiT ODE (noise [repeats*L, mel] at t=0 -> mel at t=1, guided) ──► BigVGAN ──► wav

The ODE is solved on HF's fixed time grid (``num_steps`` points of ``linspace(0, 1)`` bent by the
sway ``t + s (cos(pi t / 2) - 1 + t)``), one Runge-Kutta 3/8-rule step per interval: four DiT
evaluations, each a conditioned and an unconditioned row (``dit.py``). ``Token2Wav.forward`` is
the one-shot decode of a whole utterance (the offline API's audio, and the reference the stream
is measured against); the request's noise is ``initial_noise(seed, ...)``.

Streaming (the reference's scheme, sized from the DiT's block mask): chunk k emits mel frames
[kC, (k+1)C) (C = ``chunk_blocks`` blocks) from a DiT solve over the window
[kC - P, (k+1)C + F), P = the blocks one forward looks back (``len(look_backward_layers)``),
F = those it looks ahead; the window's noise is the same slice of the utterance's noise. A chunk
starts once the talker has the frames up to its window's end (the last one when the talker ends).

    blocks:   0  1  2  3  4  5  6  7  8  9      (7B config: C = 3 blocks of 24 frames, P = 2, F = 1)
    chunk 0:  K  K  K  F                         K: kept; P, F: context, solved then dropped
    chunk 1:     P  P  K  K  K  F
    chunk 2:              P  P  K  K  K  F

One forward's receptive field is exactly P back and F ahead, so a single evaluation over a window
gives the kept frames exactly; the ODE chains 4 (num_steps - 1) evaluations, whose receptive field
spans the utterance, so the streamed mel differs from the one-shot: within 0.5% relative L2 in
tests/models/qwen2_5_omni/test_token2wav.py (with random weights; a trained DiT may couple blocks
more). The windows are ``token2wav_stream.py``'s. The vocoder is exact: each span of final mel frames is
decoded with ``vocoder_context`` frames of real context either side (BigVGAN's receptive field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from omniwalk.errors import CheckpointError, ConfigError, InvalidRequestError
from omniwalk.models.json_fields import Section
from omniwalk.models.qwen2_5_omni.networks.bigvgan import BigVGAN, BigVGANConfig, read_bigvgan_config
from omniwalk.models.qwen2_5_omni.networks.dit import DiT, DiTConfig, block_masks, read_dit_config

SAMPLE_RATE = 24000


@dataclass(frozen=True)
class FlowMatchingConfig:
    """The ODE solve; HF's ``Qwen2_5OmniToken2WavModel.forward`` defaults (the checkpoint ships none)."""

    num_steps: int = 10  # time points; num_steps - 1 Runge-Kutta steps of 4 DiT evaluations
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0


@dataclass(frozen=True)
class Token2WavConfig:
    dit: DiTConfig
    bigvgan: BigVGANConfig
    flow: FlowMatchingConfig = FlowMatchingConfig()

    @classmethod
    def from_hf(cls, section: dict | Section, path: str = "token2wav_config") -> Token2WavConfig:
        """HF's ``token2wav_config`` (a dict, or a ``Section`` of the whole config)."""
        s = section if isinstance(section, Section) else Section(section, path)
        cfg = cls(read_dit_config(s.section("dit_config")), read_bigvgan_config(s.section("bigvgan_config")))
        if cfg.dit.mel_dim != cfg.bigvgan.mel_dim:
            raise ConfigError(f"{s.name('dit_config.mel_dim')} must equal bigvgan_config.mel_dim")
        return cfg


def ode_times(num_steps: int, sway: float, device=None) -> torch.Tensor:
    """The ``num_steps`` time points of the solve, fp32 (HF's grid: linspace bent by the sway)."""
    if num_steps < 2:
        raise InvalidRequestError(f"token2wav_num_steps must be >= 2, got {num_steps}")
    t = torch.linspace(0, 1, num_steps, device=device, dtype=torch.float32)
    return t + sway * (torch.cos(torch.pi / 2 * t) - 1 + t)


def rk38_step(f, t0: torch.Tensor, t1: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One Runge-Kutta 3/8-rule step of dx/dt = f(t, x) from t0 to t1 (per-row [N] or scalar times,
    x [N, T, mel]); the operations in HF's order, so one row alone rounds as HF does."""
    dt = t1 - t0
    dx = dt[:, None, None] if dt.dim() else dt  # broadcast over each row's frames
    k1 = f(t0, x)
    k2 = f(t0 + dt * (1 / 3), x + dx * k1 * (1 / 3))
    k3 = f(t0 + dt * (2 / 3), x + dx * (k2 - k1 * (1 / 3)))
    k4 = f(t1, x + dx * (k1 - k2 + k3))
    return x + (k1 + 3 * (k2 + k3) + k4) * dx / 8


def initial_noise(seed: int, num_frames: int, mel_dim: int, device="cpu") -> torch.Tensor:
    """The request's noise [1, num_frames, mel_dim]: drawn on the CPU from ``seed``, then moved."""
    return torch.randn([1, num_frames, mel_dim], generator=torch.Generator("cpu").manual_seed(seed)).to(device)


class NoiseStream:
    """``initial_noise`` drawn piece by piece as an utterance grows.

    NOTE: the CPU generator draws normals in groups of 16 (Box-Muller over 16 uniforms), so
    pieces of whole groups concatenate to one draw of their total. Pieces here are whole groups,
    so the first n frames equal ``initial_noise(seed, n, ...)`` whenever n * mel_dim % 16 == 0
    (always for mel_dim = 80).
    """

    def __init__(self, seed: int, mel_dim: int):
        self.generator = torch.Generator("cpu").manual_seed(seed)
        self.mel_dim = mel_dim
        self.group = 16 // math.gcd(16, mel_dim)  # frames per whole group of 16 values
        self.frames = torch.empty(0, mel_dim)

    def get(self, start: int, end: int) -> torch.Tensor:
        """Noise frames [start, end) -> [end - start, mel_dim] (CPU)."""
        if end > self.frames.shape[0]:
            more = -(-(end - self.frames.shape[0]) // self.group) * self.group
            self.frames = torch.cat([self.frames, torch.randn([more, self.mel_dim], generator=self.generator)])
        return self.frames[start:end]


class Token2Wav(nn.Module):
    """DiT + BigVGAN, named as HF's ``Qwen2_5OmniToken2WavModel`` (checkpoint prefix ``token2wav.``)."""

    def __init__(self, cfg: Token2WavConfig):
        super().__init__()
        self.cfg = cfg
        self.code2wav_dit_model = DiT(cfg.dit)
        self.code2wav_bigvgan_model = BigVGAN(cfg.bigvgan)

    @property
    def dit(self) -> DiT:
        return self.code2wav_dit_model

    @property
    def bigvgan(self) -> BigVGAN:
        return self.code2wav_bigvgan_model

    def check_codes(self, codes: torch.Tensor) -> None:
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > self.cfg.dit.num_embeds):
            raise InvalidRequestError(f"token2wav codec ids must be in [0, {self.cfg.dit.num_embeds}]")

    def speaker_rows(self, cond: torch.Tensor, ref_mel: torch.Tensor) -> torch.Tensor:
        """A voice's ``spk_dict`` entry (cond [1, enc_emb_dim], ref_mel [1, T, mel]) -> its DiT rows."""
        return self.dit.speaker_rows(cond.reshape(-1).float(), ref_mel.reshape(-1, self.cfg.dit.mel_dim).float())

    def solve(self, x: torch.Tensor, conditions: torch.Tensor, times: torch.Tensor, flow: FlowMatchingConfig):
        """The ODE over one unpadded row: x [1, T, mel] noise, conditions [2, T, ...] -> mel [1, T, mel]."""
        masks = block_masks(self.cfg.dit, [x.shape[1]] * 2, x.shape[1], x.device)

        def f(t, h):
            return self.dit.velocity(h, t.reshape(1), conditions, masks, flow.guidance_scale)

        for t0, t1 in zip(times[:-1], times[1:], strict=True):
            x = rk38_step(f, t0, t1, x)
        return x

    @torch.inference_mode()
    def forward(
        self, codes: torch.Tensor, speaker: torch.Tensor, noise: torch.Tensor, num_steps: int | None = None
    ) -> torch.Tensor:
        """One-shot decode: codes [L], ``speaker_rows``, noise [1, repeats * L, mel] -> waveform [samples]."""
        self.check_codes(codes)
        frames = codes.shape[0] * self.cfg.dit.repeats
        if not 0 < frames <= self.cfg.dit.max_position_embeddings:
            raise InvalidRequestError(
                f"token2wav takes 1 to {self.cfg.dit.max_position_embeddings} mel frames, got {frames}"
            )
        flow = self.cfg.flow
        times = ode_times(num_steps or flow.num_steps, flow.sway_coefficient, codes.device)
        mel = self.solve(noise, self.dit.condition_rows(speaker, codes), times, flow)
        return self.bigvgan(mel.transpose(1, 2))[0]


def load_state_dict_checked(module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Load tensors named ``prefix + name`` into ``module``; missing, unexpected or mis-shaped
    tensors are a ``CheckpointError`` that names them."""
    ours = module.state_dict()
    given = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    problems = [f"missing {prefix}{k}" for k in sorted(set(ours) - set(given))]
    problems += [f"unexpected {prefix}{k}" for k in sorted(set(given) - set(ours))]
    problems += [
        f"{prefix}{k} has shape {tuple(v.shape)}, expected {tuple(ours[k].shape)}"
        for k, v in given.items()
        if k in ours and v.shape != ours[k].shape
    ]
    if problems:
        raise CheckpointError(f"{len(problems)} token2wav tensor problem(s): {'; '.join(problems[:8])}")
    module.load_state_dict(given)
