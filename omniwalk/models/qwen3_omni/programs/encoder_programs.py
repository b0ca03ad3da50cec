"""Qwen3-Omni's vision encoder program: the shared one (``models/common/programs/encoder_programs.py``)
with CUDA graphs. With graphs on, the layer loop (and the mergers, DeepStack taps included) of a call
whose layout fits a bucket replays a graph over the padded layout (``omniwalk.engine.packed_graphs``);
the patch embedding and rotary tables stay eager. (Its audio program is the shared one, which graphs
the layer loop itself.)
"""

from __future__ import annotations

import torch

from omniwalk.engine.packed_graphs import PackedGraphs, layout_buckets
from omniwalk.layers.vision import VisionOutput
from omniwalk.models.common.programs import encoder_programs
from omniwalk.models.common.programs.encoder_programs import GRAPH_KNOB, vision_graph_specs
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

# Vision segments are frame groups: a 256x256 image has 256 patches and a video frame group at
# least 512 (the video resize's minimum), so fewer are uncommon (they spill into larger buckets).
MIN_COMMON_FRAME_PATCHES = 256


class VisionEncoderProgram(encoder_programs.VisionEncoderProgram):
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        super().__init__(encoder, device, dtype, vision_pixels)
        buckets = layout_buckets(graph_max_tokens, None, MIN_COMMON_FRAME_PATCHES)
        specs = vision_graph_specs(encoder.cfg.hidden_size, encoder.cfg.head_dim, dtype)
        self.graphs = PackedGraphs("vision encoder", self._layers, specs, buckets, device, GRAPH_KNOB)

    def _layers(self, x, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, torch.Tensor]:
        main, deepstack = self.encoder.encode(x, cos, sin, cu_seqlens, max_seqlen)
        return {"embeddings": main, **{f"deepstack{i}": level for i, level in enumerate(deepstack)}}

    def capture_graphs(self, pool=None):
        return self.graphs.capture(pool)

    def stats(self) -> dict:
        return super().stats() | self.graphs.stats()

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
