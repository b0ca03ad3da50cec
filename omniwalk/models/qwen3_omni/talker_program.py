"""Engine program for the talker (+ code predictor), streaming behind the thinker.

A request's talker inputs are its prefix (user turns + assistant header, built once the thinker
has its first tokens) followed by one row per frame: the frame's codec embeddings summed, plus
the projection of the thinker's next answer token (``text_entry``). Frame f's row can only be
built once the thinker has produced token f + 2 (so token f + 1 is known not to be the last,
which HF never speaks) or has finished: the talker lags the thinker by two tokens and never
waits for it to finish. Each step samples group 0 where a request's inputs end, then runs the
code predictor for groups 1..G-1.
"""

from __future__ import annotations

import torch

from omniwalk.device import to_device
from omniwalk.engine.paged_attention import PagedBatch
from omniwalk.engine.request import EngineRequest
from omniwalk.models.qwen3_omni.talker import Talker
from omniwalk.models.qwen3_omni.talker_prompt import talker_prefix
from omniwalk.models.qwen3_omni.thinker import Thinker
from omniwalk.sampling import sample_on_device

EOS, PAD = "eos", "pad"


def text_entry(generated: list[int], finished: bool, frame: int, im_end: int) -> int | str | None:
    """The text part of the input row after frame ``frame``: a generated token id, EOS (tts_eos),
    PAD (tts_pad), or None while the thinker has not decided it yet.

    HF speaks generated tokens 1 .. S-1 one per frame, S = min(index of the thinker EOS, L - 1)
    for L generated tokens (the last token is never run, so it has no hidden state), then
    tts_eos once, then tts_pad.
    """
    k = frame + 1
    if not finished:
        return generated[k] if k <= len(generated) - 2 else None
    spoken = generated.index(im_end) if im_end in generated else len(generated)
    last = min(spoken, len(generated) - 1)
    return generated[k] if k < last else EOS if k == last else PAD


class TalkerProgram:
    def __init__(self, talker: Talker, thinker: Thinker, position_id_per_seconds: float, device):
        self.talker, self.thinker, self.device = talker, thinker, device
        self.position_id_per_seconds = position_id_per_seconds
        t = thinker.tokens
        self.im_end = t.im_end
        with torch.inference_mode():
            special = thinker.model.embed_tokens(torch.tensor([t.tts_bos, t.tts_eos, t.tts_pad], device=device))
            self.special = special  # thinker input embeddings of (tts_bos, tts_eos, tts_pad)
            _, eos, pad = talker.text_projection(special.to(talker.codec_head.weight)).unbind(0)
        self.text_rows = {EOS: eos, PAD: pad}

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        ts, th = req.state.talker, req.state.thinker
        if ts.finished:
            return 0
        if ts.prefix is None:
            if not th.is_finished and th.num_generated < 2:
                return 0
            return ts.prefix_length - num_cached
        if num_cached < ts.num_inputs:  # prefill chunks, or recompute after preemption
            return ts.num_inputs - num_cached
        return int(ts.pending is not None and self._text(req) is not None)

    def is_finished(self, req: EngineRequest) -> bool:
        return req.state.talker.finished

    def on_preempt(self, req: EngineRequest) -> None:
        """Nothing to undo: the input rows are kept and re-fed."""

    def _text(self, req: EngineRequest):
        th = req.state.thinker
        return text_entry(th.generated, th.is_finished, len(req.state.talker.frames) - 1, self.im_end)

    @torch.inference_mode()
    def run(self, batch: list[tuple[EngineRequest, int, int]], kv: PagedBatch) -> None:
        rows, positions, new_rows = [], [], []
        for req, start, n in batch:
            ts = req.state.talker
            if ts.prefix is None:
                self._build_prefix(req)
            new = self._new_row(req) if start + n > ts.num_inputs else None
            rows.append(self._rows(req, start, n, new))
            positions.append(ts.positions.span(start, n))
            new_rows.append(new)
        h = self.talker.model(torch.cat(rows), to_device(torch.cat(positions, 1), self.device), kv)
        ends = (torch.tensor([n for _, _, n in batch]).cumsum(0) - 1).tolist()
        ready = []
        for (req, start, n), new, end in zip(batch, new_rows, ends, strict=True):
            ts = req.state.talker
            if new is not None:
                ts.rows.append(new)
                ts.pending = None
            if start + n == ts.num_inputs:  # the inputs end here: the next frame is due
                ready.append((req, end))
        if ready:
            self._next_frames(
                [req for req, _ in ready], h[to_device([end for _, end in ready], self.device, torch.long)]
            )

    def _build_prefix(self, req: EngineRequest) -> None:
        th, ts = req.state.thinker, req.state.talker
        first = self.thinker.model.embed_tokens(to_device(th.generated[:1], self.device, torch.long))[0]
        ts.prefix, ts.positions = talker_prefix(
            self.talker,
            self.thinker.tokens,
            prompt_ids=th.prompt.token_ids,
            embeddings=th.prompt_embeddings,
            accept_hidden=th.prompt_accept_hidden,
            first_answer=first,
            special_embeddings=self.special,
            spans=th.prompt.spans,
            speaker=ts.speaker,
            position_id_per_seconds=self.position_id_per_seconds,
        )

    def _new_row(self, req: EngineRequest) -> torch.Tensor:
        entry = self._text(req)
        if isinstance(entry, str):
            text = self.text_rows[entry]
        else:
            embedding = self.thinker.model.embed_tokens(to_device([entry], self.device, torch.long))
            text = self.talker.text_projection(embedding.to(self.talker.codec_head.weight))[0]
        return req.state.talker.pending + text

    @staticmethod
    def _rows(req: EngineRequest, start: int, n: int, new: torch.Tensor | None) -> torch.Tensor:
        ts = req.state.talker
        p = ts.prefix_length
        parts = [ts.prefix[start : min(start + n, p)]]
        parts += [r[None] for r in ts.rows[max(start, p) - p : start + n - p]]
        if new is not None:
            parts.append(new[None])
        return torch.cat(parts)

    def _next_frames(self, reqs: list[EngineRequest], hidden: torch.Tensor) -> None:
        """Sample group 0 and run the code predictor for groups 1..G-1 of every ready request, all
        on the device; then read the frames back once."""
        states = [req.state.talker for req in reqs]
        code0 = sample_on_device(self.talker.group0_logits(hidden), [ts.sampler for ts in states])
        code0_embedding = self.talker.model.codec_embedding(code0)
        cp_states = [ts.cp_sampler for ts in states]
        rest, rest_sum = self.talker.code_predictor(hidden, code0_embedding, lambda x: sample_on_device(x, cp_states))
        frames = torch.cat([code0[:, None], rest], dim=1).cpu()  # NOTE: the step's one host read
        for row, req in enumerate(reqs):
            req.guarded(self._commit_frame, req, frames[row], code0_embedding[row] + rest_sum[row])

    def _commit_frame(self, req: EngineRequest, frame: torch.Tensor, codec_sum: torch.Tensor) -> None:
        """Keep the frame unless group 0 is codec EOS; stop at EOS or the frame limit."""
        ts = req.state.talker
        if int(frame[0]) == self.talker.cfg.codec.eos:
            ts.finished = True
            return
        ts.frames.append(frame)
        if len(ts.frames) == ts.params.max_audio_frames:
            ts.finished = True
        else:
            ts.pending = codec_sum
