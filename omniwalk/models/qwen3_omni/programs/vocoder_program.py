"""Engine program for Code2Wav: exact streaming chunks, batched across requests.

Each request decodes its frames in chunks (``VocoderStreamConfig``: a small first chunk for time to first
audio, then chunks that grow to full size as fast as playback keeps up with a talker at the speed it assumes:
at 2x real time they at most double) against its own stream state, so the concatenated chunks equal a one-shot
decode. Started streams live in the rows of one fixed-shape state pool (a slot per stream, taken at its first
chunk, given back when it leaves the stage); a batch gathers its rows, decodes, and scatters them back.
Requests whose chunks have the same length and freshness decode in one call.

A stream's last chunk may be short (the talker ended); it decodes padded with code-0 frames to
its scheduled width and keeps only its own samples, which is exact: samples never depend on later
frames (``code2wav.py``), and the stream's state is not used again. So every call has one of the
schedule's few shapes (``VocoderStreamConfig.chunk_kinds``: the first chunk, then each width the
chunks grow through), and on CUDA each replays graphs captured at start-up per batch bucket
(padding rows decode zeros into a scratch row); larger batches run the same function eagerly and
are counted in ``stats``. If every slot is taken, a new stream waits for one (a stream holding a
slot always finishes, so it is freed).

A call decodes at most ``max_batch`` streams. Kernels round differently at other batch sizes, so a
stream's samples depend on its batch-mates to float rounding (~1e-7); ``max_batch = 1`` decodes
every stream alone, at fixed shapes, and its audio is bit-identical whatever else runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F

from omniwalk.device import HostCopy, to_device
from omniwalk.engine.batch_stage import BatchProgram
from omniwalk.engine.cuda_graphs import GraphedStep, StaticInput, batch_buckets, even_pieces
from omniwalk.engine.request import EngineRequest, Work
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig


class VocoderProgram(BatchProgram):
    def __init__(
        self,
        vocoder: Code2Wav,
        config: VocoderStreamConfig,
        device,
        max_streams: int,
        max_batch: int,
        graph_max_batch=0,
    ):
        self.vocoder, self.config, self.device, self.max_batch = vocoder, config, device, max_batch
        self.pool = vocoder.new_state(max_streams + 1, padded=True)  # the last row: scratch for padding rows
        self.scratch = max_streams
        self.free = list(range(max_streams - 1, -1, -1))
        self.slots: dict[str, int] = {}  # request id -> its pool row
        self.graph_max_batch = min(graph_max_batch, max_streams, max_batch)
        self.graphs: dict[tuple[int, bool], GraphedStep] = {}  # (frames, fresh) -> graphs per batch bucket
        self.num_eager_calls = 0  # decode calls that fit no graph while graphs are on

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        ts, vs = req.state.talker, req.state.vocoder
        available = len(ts.frames) - vs.num_decoded
        chunk = self.config.next_chunk(vs.num_decoded)
        n = chunk if available >= chunk else available if ts.finished else 0
        if not n or (n > budget and not batch_is_empty):
            return 0
        if req.id not in self.slots:
            if not self.free:
                return 0
            self.slots[req.id] = self.free.pop()
        return n

    def release(self, req: EngineRequest) -> None:
        slot = self.slots.pop(req.id, None)
        if slot is not None:
            self.free.append(slot)

    def is_finished(self, req: EngineRequest) -> bool:
        ts, vs = req.state.talker, req.state.vocoder
        return ts.finished and vs.num_emitted == len(ts.frames)  # (not before its last chunk is out)

    def _decode(self, codes: torch.Tensor, slots: torch.Tensor, fresh: bool) -> dict[str, torch.Tensor]:
        """codes [b, T, Q] of the streams in pool rows ``slots`` [b] -> their PCM [b, samples]."""
        state = self.vocoder.new_state(len(slots)) if fresh else self.pool.gather(slots)
        wav = self.vocoder.decode(codes, state)
        self.pool.scatter_(slots, state)
        return {"wav": wav.float()}

    def capture_graphs(self, pool=None):
        """Graphs of every chunk kind of the schedule (width and freshness), per batch bucket."""
        if not self.graph_max_batch:
            return pool
        groups = self.vocoder.cfg.num_quantizers
        for frames, fresh in self.config.chunk_kinds():
            inputs = {
                "codes": StaticInput((frames, groups), torch.long),
                "slots": StaticInput((), torch.long, self.scratch),
            }

            def decode(codes, slots, fresh=fresh):
                return self._decode(codes, slots, fresh)

            name = f"vocoder {'first ' if fresh else ''}chunk {frames}"
            graph = GraphedStep(name, decode, inputs, batch_buckets(self.graph_max_batch), self.device)
            pool = graph.capture(pool)
            self.graphs[(frames, fresh)] = graph
        return pool

    def stats(self) -> dict:
        return {"graph_replays": sum(g.num_replays for g in self.graphs.values()), "eager_calls": self.num_eager_calls}

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> Callable[[], None]:
        groups: dict[tuple[int, bool], list[EngineRequest]] = defaultdict(list)
        for req, n in batch:
            decoded = req.state.vocoder.num_decoded
            groups[(self.config.next_chunk(decoded), decoded == 0)].append((req, n))
        limit = self.graph_max_batch or self.max_batch  # (graphs on: pieces that each replay one)
        commits = [
            self._call(width, fresh, piece)
            for (width, fresh), group in groups.items()
            for piece in even_pieces(group, limit)
        ]
        for req, n in batch:  # launched (all of it, or nothing if a call raised): next come the frames after
            req.state.vocoder.num_decoded += n

        def commit() -> None:
            for done in commits:
                done()

        return commit

    def _call(self, width: int, fresh: bool, items: list[Work]) -> Callable[[], None]:
        """Decode ``width`` frames per stream (a short last chunk padded); the returned function
        reads the samples back and emits each stream its own."""
        reqs = [req for req, _ in items]
        frames = [F.pad(self._frames(req, n), (0, 0, 0, width - n)) for req, n in items]
        inputs = {
            "codes": to_device(torch.stack(frames), self.device),
            "slots": to_device([self.slots[req.id] for req in reqs], self.device, torch.long),
        }
        graph = self.graphs.get((width, fresh))
        if graph is not None and graph.fits(len(reqs)):
            wav = graph.run(len(reqs), inputs)["wav"]
        else:
            self.num_eager_calls += bool(self.graph_max_batch)
            wav = self._decode(inputs["codes"], inputs["slots"], fresh)["wav"]
        copy = HostCopy(wav)  # the call's one read, queued now (before a later replay reuses the buffer)
        per_frame = self.vocoder.cfg.samples_per_frame

        def commit() -> None:
            for (req, n), row in zip(items, copy.get(), strict=True):
                if req.status.is_done:  # aborted or failed after the launch
                    continue
                vs = req.state.vocoder
                row = row[: self.vocoder.num_samples(n) if fresh else n * per_frame]
                vs.num_emitted += n
                vs.chunks.append(row)
                req.emit("audio", row)

        return commit

    @staticmethod
    def _frames(req: EngineRequest, n: int) -> torch.Tensor:
        vs = req.state.vocoder
        return torch.stack(req.state.talker.frames[vs.num_decoded : vs.num_decoded + n])
