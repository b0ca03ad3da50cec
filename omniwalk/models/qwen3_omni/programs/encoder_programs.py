"""Engine programs for the audio and vision encoders: pack items of many requests into one call.

Work units are encoder input sizes (mel frames for audio, patches for vision). A request's items
go into one batch together; an over-budget request runs alone.

With CUDA graphs on, the layer loop (and what follows it) of a call whose layout fits a bucket
replays a graph over the padded layout (``omniwalk.engine.packed_graphs``); the frontend (audio
convs, vision patch embedding and rotary tables) stays eager.
"""

from __future__ import annotations

import math

import torch

from omniwalk.device import to_device
from omniwalk.engine.cuda_graphs import StaticInput
from omniwalk.engine.packed_graphs import PackedGraphs, layout_buckets
from omniwalk.engine.request import EngineRequest
from omniwalk.media.mel import log_mel, num_mel_frames
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder, VisionOutput
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

KNOB = "encoder_graph_max_tokens (0 = encoders run eagerly)"
# Vision segments are frame groups: a 256x256 image has 256 patches and a video frame group at
# least 512 (the video resize's minimum), so fewer are uncommon (they spill into larger buckets).
MIN_COMMON_FRAME_PATCHES = 256


def _fits(cost: int, budget: int, batch_is_empty: bool) -> int:
    return cost if cost and (cost <= budget or batch_is_empty) else 0


class AudioEncoderProgram:
    def __init__(self, encoder: AudioEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        self.encoder, self.device, self.dtype = encoder, device, dtype
        # segments are attention windows; the shortest common clip is one chunk (1 s)
        buckets = layout_buckets(graph_max_tokens, encoder.window_tokens, encoder.chunk_tokens)
        specs = {"x": StaticInput((encoder.cfg.d_model,), dtype)}
        self.graphs = PackedGraphs("audio encoder", self._layers, specs, buckets, device, KNOB)

    def _layers(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, torch.Tensor]:
        return {"out": self.encoder.encode(x, cu_seqlens, max_seqlen)}

    def capture_graphs(self, pool=None):
        return self.graphs.capture(pool)

    def stats(self) -> dict:
        return self.graphs.stats()

    @staticmethod
    def _pending(req: EngineRequest) -> list[int]:
        return [i for i, out in enumerate(req.state.media.audio_out) if out is None]

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        waves = req.state.media.waves
        return _fits(sum(num_mel_frames(len(waves[i])) for i in self._pending(req)), budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[tuple[EngineRequest, int]]) -> None:
        slots = [(req, i) for req, _ in batch for i in self._pending(req)]
        waves = [to_device(torch.from_numpy(req.state.media.waves[i]), self.device) for req, i in slots]
        features, _ = log_mel(waves)  # each clip as if alone (the processor's token counts)
        frames = [num_mel_frames(len(w)) for w in waves]  # log_mel's valid frames, known on the host
        out = self.encode(features.to(self.dtype), frames)
        for (req, i), rows in zip(slots, out.split(self.encoder.output_lengths(frames)), strict=True):
            req.state.media.audio_out[i] = rows

    @torch.inference_mode()
    def encode(self, features: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """The encoder's rows for these clips: replayed from a graph when the layout fits a bucket."""
        lengths = self.encoder.segment_lengths(frames)
        bucket = self.graphs.pick(lengths)
        if bucket is None:
            return self.encoder(features, frames)
        x = self.encoder.embed(features, frames)
        return self.graphs.run(bucket, lengths, {"x": x})["out"][: x.shape[0]].clone()

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)


class VisionEncoderProgram:
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        self.encoder, self.device, self.dtype = encoder, device, dtype
        buckets = layout_buckets(graph_max_tokens, None, MIN_COMMON_FRAME_PATCHES)
        rotary = (1, encoder.cfg.head_dim)
        specs = {
            "x": StaticInput((encoder.cfg.hidden_size,), dtype),
            "cos": StaticInput(rotary, torch.float32, 1.0),
            "sin": StaticInput(rotary, torch.float32, 0.0),
        }
        self.graphs = PackedGraphs("vision encoder", self._layers, specs, buckets, device, KNOB)

    def _layers(self, x, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, torch.Tensor]:
        main, deepstack = self.encoder.encode(x, cos, sin, cu_seqlens, max_seqlen)
        return {"embeddings": main, **{f"deepstack{i}": level for i, level in enumerate(deepstack)}}

    def capture_graphs(self, pool=None):
        return self.graphs.capture(pool)

    def stats(self) -> dict:
        return self.graphs.stats()

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
        out = self.encode(pixels, [item.grid_thw for _, item, _ in slots])
        for (req, _, i), result in zip(slots, out.split(), strict=True):
            req.state.media.vision_out[i] = result

    def is_finished(self, req: EngineRequest) -> bool:
        return not self._pending(req)

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> VisionOutput:
        """The encoder's output for these items: replayed from a graph when the layout fits a bucket."""
        lengths = self.encoder.segment_lengths(grids)
        bucket = self.graphs.pick(lengths)
        if bucket is None:
            return self.encoder(pixels, grids)
        x, cos, sin = self.encoder.embed(pixels, grids)
        out = self.graphs.run(bucket, lengths, {"x": x, "cos": cos, "sin": sin})
        rows = x.shape[0] // self.encoder.cfg.spatial_merge_size**2  # real rows: padding is whole merge groups
        main, *deepstack = (t[:rows].clone() for t in out.values())
        return VisionOutput(main, deepstack, self.encoder.tokens_per_item(grids))
