"""Qwen3-Omni's talker and vocoder parts of a request's state (``models/common/programs/request_state.py``
holds the rest): talker input rows and frames (talker program); frames decoded and samples emitted
(vocoder program; the stream state lives in its pool)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omniwalk.models.common.processing.positions import RopePositions
from omniwalk.models.qwen3_omni.networks.talker import TalkerSamplingParams
from omniwalk.sampling import SamplerState


@dataclass
class TalkerState:
    params: TalkerSamplingParams
    speaker: int
    sampler: SamplerState  # group 0 (codec EOS, repetition penalty over its own history)
    cp_sampler: SamplerState  # groups 1..G-1
    prefix_length: int
    prefix: torch.Tensor | None = None  # [P, hidden] built when the thinker has its first tokens
    positions: RopePositions | None = None
    rows: list[torch.Tensor] = field(default_factory=list)  # decode input rows fed after the prefix
    pending: torch.Tensor | None = None  # codec sum of the newest frame (device), waiting for its text entry
    frames: list[torch.Tensor] = field(default_factory=list)  # [G] int64 per frame read back (committed)
    num_inflight: int = 0  # frames drawn but not read back yet (their codec sum is ``pending`` already)
    finished: bool = False

    @property
    def num_inputs(self) -> int:
        return (self.prefix_length if self.prefix is not None else 0) + len(self.rows)

    @property
    def num_frames(self) -> int:
        """Frames drawn, those not read back yet included."""
        return len(self.frames) + self.num_inflight


@dataclass
class VocoderState:
    num_decoded: int = 0  # frames whose decode was launched
    num_emitted: int = 0  # frames whose audio was read back and emitted (one step later)
    chunks: list[torch.Tensor] = field(default_factory=list)  # PCM chunks emitted, in order
    finished: bool = False
