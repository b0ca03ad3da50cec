"""Qwen3-Omni's encoder programs: the shared ones (``models/common/programs/encoder_programs.py``)
with CUDA graphs. With graphs on, the layer loop (and what follows it) of a call whose layout fits
a bucket replays a graph over the padded layout (``omniwalk.engine.packed_graphs``); the frontend
(audio convs, vision patch embedding and rotary tables) stays eager.
"""

from __future__ import annotations

import torch

from omniwalk.engine.cuda_graphs import StaticInput
from omniwalk.engine.packed_graphs import PackedGraphs, layout_buckets
from omniwalk.layers.vision import VisionOutput
from omniwalk.models.common.programs import encoder_programs
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

KNOB = "encoder_graph_max_tokens (0 = encoders run eagerly)"
# Vision segments are frame groups: a 256x256 image has 256 patches and a video frame group at
# least 512 (the video resize's minimum), so fewer are uncommon (they spill into larger buckets).
MIN_COMMON_FRAME_PATCHES = 256


class AudioEncoderProgram(encoder_programs.AudioEncoderProgram):
    def __init__(self, encoder: AudioEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        super().__init__(encoder, device, dtype)
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

    @torch.inference_mode()
    def encode(self, features: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """The encoder's rows for these clips: replayed from a graph when the layout fits a bucket."""
        lengths = self.encoder.segment_lengths(frames)
        bucket = self.graphs.pick(lengths)
        if bucket is None:
            return self.encoder(features, frames)
        x = self.encoder.embed(features, frames)
        return self.graphs.run(bucket, lengths, {"x": x})["out"][: x.shape[0]].clone()


class VisionEncoderProgram(encoder_programs.VisionEncoderProgram):
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        super().__init__(encoder, device, dtype, vision_pixels)
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
