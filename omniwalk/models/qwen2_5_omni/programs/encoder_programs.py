"""Engine programs for Qwen2.5-Omni's audio and vision encoders: the items of many requests packed
into one call (work units: mel frames for audio, patches for vision; an over-budget request runs
alone). TODO: CUDA graphs of the layer loops (Qwen3-Omni's ``PackedGraphs`` take one varlen
pattern; the window/full pair of the vision encoder needs two)."""

from __future__ import annotations

import math

import torch

from omniwalk.device import to_device
from omniwalk.engine.batch_stage import BatchProgram
from omniwalk.engine.request import EngineRequest, Work
from omniwalk.media.mel import log_mel, num_mel_frames
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import AudioEncoder
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import VisionEncoder
from omniwalk.models.qwen2_5_omni.processing.media_inputs import vision_pixels
from omniwalk.models.qwen3_omni.programs.encoder_programs import _fits


class AudioEncoderProgram(BatchProgram):
    def __init__(self, encoder: AudioEncoder, device, dtype: torch.dtype):
        self.encoder, self.device, self.dtype = encoder, device, dtype

    @staticmethod
    def _pending(req: EngineRequest) -> list[int]:
        return [i for i, out in enumerate(req.state.media.audio_out) if out is None]

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        waves = req.state.media.waves
        cost = sum(num_mel_frames(len(waves[i]), zero_tail=True) for i in self._pending(req))
        return _fits(cost, budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> None:
        slots = [(req, i) for req, _ in batch for i in self._pending(req)]
        waves = [to_device(torch.from_numpy(req.state.media.waves[i]), self.device) for req, i in slots]
        features, _ = log_mel(waves, zero_tail=True)  # each clip as the processor pads it
        frames = [num_mel_frames(len(w), zero_tail=True) for w in waves]
        out = self.encoder(features.to(self.dtype), frames)
        for (req, i), rows in zip(slots, out.split(self.encoder.output_lengths(frames)), strict=True):
            req.state.media.audio_out[i] = rows

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)


class VisionEncoderProgram(BatchProgram):
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype):
        self.encoder, self.device, self.dtype = encoder, device, dtype

    @staticmethod
    def _pending(req: EngineRequest) -> list[int]:
        return [i for i, out in enumerate(req.state.media.vision_out) if out is None]

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        items = req.state.media.vision
        return _fits(sum(math.prod(items[i].grid_thw) for i in self._pending(req)), budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> None:
        slots = [(req, req.state.media.vision[i], i) for req, _ in batch for i in self._pending(req)]
        pixels = torch.cat([vision_pixels(item, self.device) for _, item, _ in slots]).to(self.dtype)
        out = self.encoder(pixels, [item.grid_thw for _, item, _ in slots])
        for (req, _, i), result in zip(slots, out.split(), strict=True):
            req.state.media.vision_out[i] = result

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)
