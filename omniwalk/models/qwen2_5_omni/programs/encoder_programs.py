"""Qwen2.5-Omni's vision encoder program: the shared one (``models/common/programs/encoder_programs.py``)
with CUDA graphs. Its blocks attend inside windows except the full-attention blocks, which attend over
whole frame groups: a second layout. With graphs on, each run of window blocks between two full-attention
blocks replays a graph over the padded window layout (``omniwalk.engine.packed_graphs``, one set of
buckets for every run); the full-attention blocks, the patch embedding, rotary tables and the merger run
eagerly on the real rows (4 of the 7B's 32 blocks).
"""

from __future__ import annotations

import torch

from omniwalk.engine.packed_graphs import PackedGraphs, layout_buckets
from omniwalk.layers.vision import VisionOutput
from omniwalk.models.common.programs import encoder_programs
from omniwalk.models.common.programs.encoder_programs import GRAPH_KNOB, vision_graph_specs
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import VisionEncoder
from omniwalk.models.qwen2_5_omni.processing.media_inputs import vision_pixels


class VisionEncoderProgram(encoder_programs.VisionEncoderProgram):
    def __init__(self, encoder: VisionEncoder, device, dtype: torch.dtype, graph_max_tokens: int = 0):
        super().__init__(encoder, device, dtype, vision_pixels)
        window = (encoder.cfg.window_tokens * encoder.cfg.spatial_merge_size) ** 2  # patches in a whole window
        buckets = layout_buckets(graph_max_tokens, window, window)
        specs = vision_graph_specs(encoder.cfg.hidden_size, encoder.cfg.head_dim, dtype)
        self.graphs = [  # (None: an empty run, between two full-attention blocks)
            PackedGraphs(
                f"vision encoder blocks {first}-{last - 1}", self._run(first, last), specs, buckets, device, GRAPH_KNOB
            )
            if last > first
            else None
            for first, last in encoder.window_runs()
        ]
        self.first = next((g for g in self.graphs if g is not None), None)  # (its counters are the program's)

    def _run(self, first: int, last: int):
        def run(x, cos, sin, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, torch.Tensor]:
            return {"x": self.encoder.window_blocks(x, cos, sin, cu_seqlens, max_seqlen, first=first, last=last)}

        return run

    def capture_graphs(self, pool=None):
        for graphs in self.graphs:
            pool = graphs.capture(pool) if graphs is not None else pool
        return pool

    def stats(self) -> dict:
        """Calls (not runs): replays of the first run's graphs, and calls that fit no bucket."""
        return super().stats() | (self.first.stats() if self.first is not None else {})

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> VisionOutput:
        """The encoder's output for these items: its window runs replayed from graphs when the window
        layout fits a bucket."""
        grids = [tuple(int(v) for v in g) for g in grids]
        x, cos, sin, layout = self.encoder.embed(pixels, grids)
        bucket = self.first.pick(layout.windows) if self.first is not None else None
        rows = x.shape[0]

        def replay_run(i: int, x: torch.Tensor) -> torch.Tensor:  # (read before the next replay of that graph)
            if self.graphs[i] is None:
                return x
            return self.graphs[i].run(bucket, layout.windows, {"x": x, "cos": cos, "sin": sin})["x"][:rows]

        x = self.encoder.layers(x, cos, sin, layout, replay_run if bucket is not None else None)
        return self.encoder.finish(x, layout, grids)
