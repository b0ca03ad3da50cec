"""Engine programs for the audio and vision encoders: pack items of many requests into one call.

Work units are encoder input sizes (mel frames for audio, patches for vision). A request's items
go into one batch together; an over-budget request runs alone.
"""

from __future__ import annotations

import math

import torch

from omniwalk.device import to_device
from omniwalk.engine.request import EngineRequest
from omniwalk.media.mel import HOP_LENGTH, log_mel
from omniwalk.models.qwen3_omni.audio_encoder import AudioEncoder
from omniwalk.models.qwen3_omni.media_inputs import vision_pixels
from omniwalk.models.qwen3_omni.vision_encoder import VisionEncoder


def _fits(cost: int, budget: int, batch_is_empty: bool) -> int:
    return cost if cost and (cost <= budget or batch_is_empty) else 0


class AudioEncoderProgram:
    def __init__(self, encoder: AudioEncoder, device, dtype: torch.dtype):
        self.encoder, self.device, self.dtype = encoder, device, dtype

    @staticmethod
    def _pending(req: EngineRequest) -> list[int]:
        return [i for i, out in enumerate(req.state.media.audio_out) if out is None]

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        waves = req.state.media.waves
        return _fits(sum(len(waves[i]) // HOP_LENGTH for i in self._pending(req)), budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[tuple[EngineRequest, int]]) -> None:
        slots = [(req, i) for req, _ in batch for i in self._pending(req)]
        waves = [to_device(torch.from_numpy(req.state.media.waves[i]), self.device) for req, i in slots]
        features, _ = log_mel(waves)  # each clip as if alone (the processor's token counts)
        frames = [len(w) // HOP_LENGTH for w in waves]  # log_mel's valid frames, known on the host
        out = self.encoder(features.to(self.dtype), frames)
        for (req, i), rows in zip(slots, out.split(self.encoder.output_lengths(frames)), strict=True):
            req.state.media.audio_out[i] = rows

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)


class VisionEncoderProgram:
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype):
        self.encoder, self.device, self.dtype = encoder, device, dtype

    @staticmethod
    def _pending(req: EngineRequest) -> list[int]:
        return [i for i, out in enumerate(req.state.media.vision_out) if out is None]

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        items = req.state.media.vision
        return _fits(sum(math.prod(items[i].grid_thw) for i in self._pending(req)), budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[tuple[EngineRequest, int]]) -> None:
        slots = [(req, req.state.media.vision[i], i) for req, _ in batch for i in self._pending(req)]
        pixels = torch.cat([vision_pixels(item, self.device) for _, item, _ in slots]).to(self.dtype)
        out = self.encoder(pixels, [item.grid_thw for _, item, _ in slots])
        for (req, _, i), result in zip(slots, out.split(), strict=True):
            req.state.media.vision_out[i] = result

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)
