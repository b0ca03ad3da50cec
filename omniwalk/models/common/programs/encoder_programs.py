"""Engine programs for the audio and vision encoders: pack items of many requests into one call.

Work units are encoder input sizes (mel frames for audio, patches for vision). A request's items
go into one batch together; an over-budget request runs alone. ``encode`` runs the encoder; a
family may override it (e.g. to replay CUDA graphs of the layer loop).

The audio program replays CUDA graphs itself (``graph_max_tokens`` > 0): an encoder's
``encode(x, cu_seqlens, max_seqlen)`` over its packed frontend rows (``embed``) is what a graph records
per layout bucket (``omniwalk.engine.packed_graphs``); the frontend and ``finish`` (what needs host
indices: Qwen2.5-Omni's per-clip pooling) stay eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from omniwalk.device import to_device
from omniwalk.engine.batch_stage import BatchProgram
from omniwalk.engine.cuda_graphs import StaticInput
from omniwalk.engine.packed_graphs import PackedGraphs, layout_buckets
from omniwalk.engine.request import EngineRequest, Work
from omniwalk.media.mel import log_mel, num_mel_frames

GRAPH_KNOB = "encoder_graph_max_tokens (0 = encoders run eagerly)"


def vision_graph_specs(hidden: int, head_dim: int, dtype: torch.dtype) -> dict[str, StaticInput]:
    """A vision encoder graph's row inputs: patches x [hidden] and the rotary tables cos, sin [1, head_dim]
    (fp32), padding rows rotated by nothing."""
    rotary = (1, head_dim)
    return {
        "x": StaticInput((hidden,), dtype),
        "cos": StaticInput(rotary, torch.float32, 1.0),
        "sin": StaticInput(rotary, torch.float32, 0.0),
    }


def fits(cost: int, budget: int, batch_is_empty: bool) -> int:
    return cost if cost and (cost <= budget or batch_is_empty) else 0


class _MediaProgram(BatchProgram):
    """What the encoder programs share: a request's items still to encode (``MediaState``: those
    under the prefix the thinker takes from keyed pages are skipped) and the counts of encoded and
    skipped items."""

    is_audio: bool  # which of ``MediaState``'s lists

    def __init__(self):
        self.num_encoded = self.num_skipped = 0

    def _pending(self, req: EngineRequest) -> list[int]:
        media = req.state.media
        return media.pending_audio if self.is_audio else media.pending_vision

    def _skipped(self, req: EngineRequest) -> list:
        media = req.state.media
        if self.is_audio:
            return media.audio_out[: media.num_skipped_audio]
        return media.vision_out[: media.num_skipped_vision]

    def _store(self, req: EngineRequest, i: int, out) -> None:
        (req.state.media.audio_out if self.is_audio else req.state.media.vision_out)[i] = out
        self.num_encoded += 1

    def is_finished(self, req: EngineRequest) -> bool:
        """Nothing to encode, and no skipped item the thinker may still ask for (it may until it
        finishes: a preempted request whose prefix pages are gone when it is readmitted)."""
        return not self._pending(req) and (not self._skipped(req) or req.state.thinker.is_finished)

    def release(self, req: EngineRequest) -> None:
        self.num_skipped += sum(out is None for out in self._skipped(req))

    def stats(self) -> dict:
        return {"items_encoded": self.num_encoded, "items_skipped": self.num_skipped}


class AudioEncoderProgram(_MediaProgram):
    """``zero_tail``: each clip featurised as the family's processor pads it (``media/mel.py``).
    ``graph_max_tokens``: the largest layout replayed from a CUDA graph (0: none)."""

    is_audio = True

    def __init__(self, encoder, device, dtype: torch.dtype, zero_tail: bool = False, graph_max_tokens: int = 0):
        super().__init__()
        self.encoder, self.device, self.dtype, self.zero_tail = encoder, device, dtype, zero_tail
        # segments are attention windows; the shortest common clip is one chunk (1 s)
        buckets = layout_buckets(graph_max_tokens, encoder.window_tokens, encoder.chunk_tokens)
        specs = {"x": StaticInput((encoder.cfg.d_model,), dtype)}
        self.graphs = PackedGraphs("audio encoder", self._layers, specs, buckets, device, GRAPH_KNOB)

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        waves = req.state.media.waves
        cost = sum(num_mel_frames(len(waves[i]), zero_tail=self.zero_tail) for i in self._pending(req))
        return fits(cost, budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> None:
        slots = [(req, i) for req, _ in batch for i in self._pending(req)]
        waves = [to_device(torch.from_numpy(req.state.media.waves[i]), self.device) for req, i in slots]
        features, _ = log_mel(waves, zero_tail=self.zero_tail)  # each clip as if alone (the processor's counts)
        frames = [num_mel_frames(len(w), zero_tail=self.zero_tail) for w in waves]  # valid frames, on the host
        out = self.encode(features.to(self.dtype), frames)
        for (req, i), rows in zip(slots, out.split(self.encoder.output_lengths(frames)), strict=True):
            self._store(req, i, rows)

    def encode(self, features: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """The encoder's rows for these clips: its layers replayed from a graph when the layout fits a bucket."""
        lengths = self.encoder.segment_lengths(frames)
        bucket = self.graphs.pick(lengths)
        if bucket is None:
            return self.encoder(features, frames)
        x = self.encoder.embed(features, frames)
        out = self.graphs.run(bucket, lengths, {"x": x})["out"][: x.shape[0]]
        return self.encoder.finish(out, frames).clone()  # (off the graph's static buffer)

    def _layers(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> dict[str, torch.Tensor]:
        return {"out": self.encoder.encode(x, cu_seqlens, max_seqlen)}

    def capture_graphs(self, pool=None):
        return self.graphs.capture(pool)

    def stats(self) -> dict:
        return super().stats() | self.graphs.stats()


class VisionEncoderProgram(_MediaProgram):
    """``pixels(item, device)``: an image or video item's encoder input (the family's preprocessing)."""

    is_audio = False

    def __init__(self, encoder, device, dtype: torch.dtype, pixels: Callable):
        super().__init__()
        self.encoder, self.device, self.dtype, self.pixels = encoder, device, dtype, pixels

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        items = req.state.media.vision
        return fits(sum(math.prod(items[i].grid_thw) for i in self._pending(req)), budget, batch_is_empty)

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> None:
        slots = [(req, req.state.media.vision[i], i) for req, _ in batch for i in self._pending(req)]
        pixels = torch.cat([self.pixels(item, self.device) for _, item, _ in slots]).to(self.dtype)
        out = self.encode(pixels, [item.grid_thw for _, item, _ in slots])
        for (req, _, i), result in zip(slots, out.split(), strict=True):
            self._store(req, i, result)

    def encode(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]):
        return self.encoder(pixels, grids)
