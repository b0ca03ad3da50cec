"""Engine program for Code2Wav: exact streaming chunks, batched across requests.

Each request decodes its frames in chunks (a smaller first chunk for time to first audio) against
its own ``Code2WavState``, so the concatenated chunks equal a one-shot decode. Requests whose
chunks have the same length and the same freshness are stacked into one decode call.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from omniwalk.device import to_device
from omniwalk.engine.request import EngineRequest
from omniwalk.models.qwen3_omni.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.code2wav_stream import Code2WavState, VocoderStreamConfig


class VocoderProgram:
    def __init__(self, vocoder: Code2Wav, config: VocoderStreamConfig, device):
        self.vocoder, self.config, self.device = vocoder, config, device

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        ts, vs = req.state.talker, req.state.vocoder
        available = len(ts.frames) - vs.num_decoded
        chunk = self.config.next_chunk(vs.num_decoded)
        n = chunk if available >= chunk else available if ts.finished else 0
        return n if n and (n <= budget or batch_is_empty) else 0

    def is_finished(self, req: EngineRequest) -> bool:
        ts, vs = req.state.talker, req.state.vocoder
        return ts.finished and vs.num_decoded == len(ts.frames)

    @torch.inference_mode()
    def run(self, batch: list[tuple[EngineRequest, int]]) -> None:
        groups: dict[tuple[int, bool], list[EngineRequest]] = defaultdict(list)
        for req, n in batch:
            groups[(n, req.state.vocoder.num_decoded == 0)].append(req)
        for (n, _), reqs in groups.items():
            codes = to_device(torch.stack([self._frames(req, n) for req in reqs]), self.device)
            states = [req.state.vocoder.stream for req in reqs]
            state = states[0] if len(states) == 1 else Code2WavState.stack(states)
            wav = self.vocoder.decode(codes, state).float()
            decoded = [req.state.vocoder.num_decoded + n for req in reqs]
            new_states = [state] if len(states) == 1 else state.split(decoded)
            for req, row, new_state in zip(reqs, wav, new_states, strict=True):
                vs = req.state.vocoder
                vs.stream, vs.num_decoded = new_state, vs.num_decoded + n
                vs.chunks.append(row.cpu())
                req.emit("audio", vs.chunks[-1])

    @staticmethod
    def _frames(req: EngineRequest, n: int) -> torch.Tensor:
        vs = req.state.vocoder
        return torch.stack(req.state.talker.frames[vs.num_decoded : vs.num_decoded + n])
