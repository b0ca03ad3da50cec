"""Engine program for the talker (+ code predictor), streaming behind the thinker.

A request's talker inputs are its prefix (user turns + assistant header, built once the thinker
has its first tokens) followed by one row per frame: the frame's codec embeddings summed, plus
the projection of the thinker's next answer token (``text_entry``). Frame f's row can only be
built once the thinker has produced token f + 2 (so token f + 1 is known not to be the last,
which HF never speaks) or has finished: the talker lags the thinker by two tokens and never
waits for it to finish. Each step samples group 0 where a request's inputs end, then runs the
code predictor for groups 1..G-1.

A step in which every request runs one row and then draws a frame (steady speech) replays a CUDA
graph of the whole frame step when one was captured for its batch size: talker decode, group-0
sampling, all code-predictor steps and their sampling, with the batch's sampling parameters as
static inputs (``sampling.BatchParams``).

Speech ends at codec EOS or at the request's frame limit (``frame_limit``): its ``max_audio_frames``,
cut to the speech cap of the answer's text once that is complete (``config.SpeechCap``: random
weights never draw EOS), never below its ``min_audio_frames``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

from omniwalk.config import SpeechCap
from omniwalk.device import HostCopy, to_device
from omniwalk.engine.cuda_graphs import GraphedStep, StaticInput, batch_buckets, graph_batch, rows_in_graph
from omniwalk.engine.kv_pages import KVStorage
from omniwalk.engine.kv_stage import KVProgram
from omniwalk.engine.paged_attention import DecodeKV, PagedBatch
from omniwalk.engine.prefill_graphs import NO_PREFILL_GRAPHS, DecoderPrefill, PrefillPlan
from omniwalk.engine.request import Chunk, EngineRequest
from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.positions import batch_spans, mrope_positions
from omniwalk.models.common.programs.prefix_keys import prefix_chain
from omniwalk.models.qwen3_omni.networks.talker import Talker
from omniwalk.models.qwen3_omni.processing.talker_prompt import kept_spans, talker_prefix, user_positions
from omniwalk.sampling import GRAPH_FIELDS, BatchParams, advance, draw

EOS, PAD = "eos", "pad"
FRAMES_PER_S = 12.5  # codec frames per second of speech: Code2Wav's 24 kHz, 1920 samples a frame


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


def frame_limit(ts, th, cap: SpeechCap) -> int:
    """The frames a request may draw: its ``max_audio_frames``, and once its answer's text is complete
    (``th.speech_ended``) at most the text's speech cap, never below its ``min_audio_frames``. (While the
    text streams, the talker speaks about one frame per text token: far under the cap.)"""
    capped = cap.max_frames(len(th.spoken), FRAMES_PER_S) if th.speech_ended else None
    limit = ts.params.max_audio_frames if capped is None else min(ts.params.max_audio_frames, capped)
    return max(limit, ts.params.min_audio_frames)


def frame_due(ts) -> bool:
    """Whether the last input row still has its frame to draw: frame j comes from input row
    ``prefix_length - 1 + j``. After a preemption the re-fed rows drew theirs already (the next
    frame then comes from the new row built from the last one's codes)."""
    return ts.num_frames == len(ts.rows)


class TalkerProgram(KVProgram):
    def __init__(
        self,
        talker: Talker,
        text_embedding: nn.Embedding,
        tokens: TokenIds,
        position_id_per_seconds: float,
        device,
        decode_attention: str = "reference",
        graph_max_batch: int = 0,
        prefill: PrefillPlan = NO_PREFILL_GRAPHS,
        speech_cap: SpeechCap | None = None,
    ):
        # the thinker's input embeddings on this stage's device (the thinker may run on another GPU, or
        # hold a tensor-parallel shard of the table)
        self.talker, self.text_embedding, self.tokens, self.device = talker, text_embedding, tokens, device
        self.position_id_per_seconds = position_id_per_seconds
        self.speech_cap = speech_cap or SpeechCap()  # (ModelConfig.speech_cap; its defaults when not given)
        self.decode_attention, self.graph_max_batch, self.prefill = decode_attention, graph_max_batch, prefill
        self.frame_graph: GraphedStep | None = None
        self.layers = DecoderPrefill("talker", talker.model, device)  # (prefill chunks)
        self.num_eager_decode_steps = 0
        t = tokens
        self.im_end = t.im_end
        with torch.inference_mode():
            special = text_embedding(torch.tensor([t.tts_bos, t.tts_eos, t.tts_pad], device=device))
            self.special = special  # thinker input embeddings of (tts_bos, tts_eos, tts_pad)
            _, eos, pad = talker.text_projection(special.to(talker.codec_head.weight)).unbind(0)
        self.text_rows = {EOS: eos, PAD: pad}

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        ts, th = req.state.talker, req.state.thinker
        if ts.finished:
            return 0
        if ts.num_frames >= self._frame_limit(req):  # (a frame in flight ends it at its commit; else the text
            ts.finished = ts.num_inflight == 0  # ended with the frames already over its cap)
            return 0
        if ts.prefix is None:
            if th.tool_call_at == 0:  # the answer is a tool call, nothing to say: no audio
                ts.finished = True
                return 0
            if not th.speech_ended and len(th.spoken) < 2:
                return 0
            return self._prefill_rows(ts, ts.prefix_length - num_cached)
        if num_cached < ts.num_inputs:  # prefill chunks, or recompute after preemption
            return self._prefill_rows(ts, ts.num_inputs - num_cached)
        return int(ts.pending is not None and self._text(req) is not None)

    def _prefill_rows(self, ts, left: int) -> int:
        """With a frame graph, the last input row waits for the next step when a frame is due after
        it: there it is a frame row of the graph, and the frame is drawn there (talker head, 15
        code-predictor passes, sampling), not by eager kernels beside the prefill."""
        return left - 1 if self.frame_graph is not None and left > 1 and frame_due(ts) else left

    def is_finished(self, req: EngineRequest) -> bool:
        return req.state.talker.finished

    def prefix_keys(self, req: EngineRequest, page_size: int) -> list[bytes]:
        """The full pages of the prefix's user part (the thinker prompt's user-turn positions: a voice
        conversation's earlier turns are the next turn's prefix), each keyed by the thinker prompt up
        to the last position its rows project (their thinker states depend on all of it, adapter
        included) and by the rows' own talker positions."""
        th = req.state.thinker
        user = user_positions(th.prompt.token_ids, self.tokens)
        at = user.nonzero().flatten().tolist()  # the thinker position of each user-part row
        n = len(at) // page_size * page_size  # (the 9-row header follows: no page holds the last row)
        if n == 0:
            return []
        rope = mrope_positions(
            req.state.talker.prefix_length, kept_spans(th.prompt.spans, user), self.position_id_per_seconds
        )
        rows = rope.span(0, n).numpy()
        pages = range(0, n, page_size)
        seed = b"talker" + (th.lora_key or "").encode()
        extra = [rows[:, p : p + page_size].tobytes() for p in pages]
        return prefix_chain(seed, th.prompt, [at[p + page_size - 1] + 1 for p in pages], extra)

    def on_preempt(self, req: EngineRequest) -> None:
        """Nothing to undo: the input rows are kept and re-fed."""

    def _frame_limit(self, req: EngineRequest) -> int:
        return frame_limit(req.state.talker, req.state.thinker, self.speech_cap)

    def _text(self, req: EngineRequest):
        th = req.state.thinker
        return text_entry(th.spoken, th.speech_ended, req.state.talker.num_frames - 1, self.im_end)

    @torch.inference_mode()
    def run(self, batch: list[Chunk], kv: PagedBatch) -> Callable[[], None] | None:
        for req, _, _ in batch:
            if req.state.talker.prefix is None:
                self._build_prefix(req)
        wants = [start + n > req.state.talker.num_inputs for req, start, n in batch]  # a new row ends the chunk
        built = iter(self._new_rows([req for (req, _, _), want in zip(batch, wants, strict=True) if want]))
        new_rows = [next(built) if want else None for want in wants]
        positions = batch_spans([(req.state.talker.positions, start, n) for req, start, n in batch])
        if all(self._frame_rows(batch)) and self.frame_graph is not None:
            if self.frame_graph.fits(len(batch)):
                x = torch.stack(
                    [
                        new if new is not None else self._input_row(req, start)
                        for (req, start, _), new in zip(batch, new_rows, strict=True)
                    ]
                )
                self._keep_new_rows(batch, new_rows)
                return self._graphed_frames(batch, x, positions, kv)
            self.num_eager_decode_steps += 1
        rows = [self._rows(req, start, n, new) for (req, start, n), new in zip(batch, new_rows, strict=True)]
        h = self.layers(torch.cat(rows), positions.T, kv)
        ends = [end - 1 for end in itertools.accumulate(n for _, _, n in batch)]
        self._keep_new_rows(batch, new_rows)
        ready = []
        for (req, start, n), end in zip(batch, ends, strict=True):
            if start + n == req.state.talker.num_inputs and frame_due(req.state.talker):  # the inputs end here
                ready.append((req, end))
        if ready:
            return self._next_frames(
                [req for req, _ in ready], h[to_device([end for _, end in ready], self.device, torch.long)]
            )
        return None

    @staticmethod
    def _keep_new_rows(batch, new_rows) -> None:
        for (req, _, _), new in zip(batch, new_rows, strict=True):
            if new is not None:
                req.state.talker.rows.append(new)
                req.state.talker.pending = None

    def _build_prefix(self, req: EngineRequest) -> None:
        th, ts = req.state.thinker, req.state.talker
        first = self.text_embedding(to_device(th.spoken[:1], self.device, torch.long))[0]
        ts.prefix, ts.positions = talker_prefix(
            self.talker,
            self.tokens,
            prompt_ids=th.prompt.token_ids,
            # the hand-off from the thinker's device: a device-to-device copy, queued on this stage's side
            embeddings=th.prompt_embeddings.to(self.device, non_blocking=True),
            accept_hidden=th.prompt_accept_hidden.to(self.device, non_blocking=True),
            first_answer=first,
            special_embeddings=self.special,
            spans=th.prompt.spans,
            speaker=ts.speaker,
            position_id_per_seconds=self.position_id_per_seconds,
        )

    def _new_rows(self, reqs: list[EngineRequest]) -> list[torch.Tensor]:
        """The next input row of each request: its last frame's summed codec embeddings plus its text
        row (the projected embedding of the next thinker token, or the cached EOS / pad row), built
        for all of them at once."""
        if not reqs:
            return []
        entries = [self._text(req) for req in reqs]
        ids = [e for e in entries if not isinstance(e, str)]
        if ids:
            embedding = self.text_embedding(to_device(ids, self.device, torch.long))
            projected = iter(self.talker.text_projection(embedding.to(self.talker.codec_head.weight)).unbind(0))
        text = torch.stack([self.text_rows[e] if isinstance(e, str) else next(projected) for e in entries])
        return list((torch.stack([req.state.talker.pending for req in reqs]) + text).unbind(0))

    @staticmethod
    def _input_row(req: EngineRequest, index: int) -> torch.Tensor:
        ts = req.state.talker
        return ts.prefix[index] if index < ts.prefix_length else ts.rows[index - ts.prefix_length]

    @staticmethod
    def _rows(req: EngineRequest, start: int, n: int, new: torch.Tensor | None) -> torch.Tensor:
        ts = req.state.talker
        p = ts.prefix_length
        parts = [ts.prefix[start : min(start + n, p)]]
        parts += [r[None] for r in ts.rows[max(start, p) - p : start + n - p]]
        if new is not None:
            parts.append(new[None])
        return torch.cat(parts)

    def _next_frames(self, reqs: list[EngineRequest], hidden: torch.Tensor) -> Callable[[], None]:
        """Sample group 0 and run the code predictor for groups 1..G-1 of every ready request, all
        on the device; the returned function reads the frames back (once) and commits them."""
        states = [req.state.talker for req in reqs]
        vocabs = self.talker.cfg.text.vocab_size, self.talker.cfg.code_predictor.vocab_size
        talker = BatchParams.of([ts.sampler for ts in states], vocabs[0], self.device)
        cp = BatchParams.of([ts.cp_sampler for ts in states], vocabs[1], self.device)
        out = self._frame_tail(hidden, talker, cp)
        return self._commit_frames(reqs, out["frames"], out["codec_sum"])

    def _frame_tail(self, hidden: torch.Tensor, talker: BatchParams, cp: BatchParams) -> dict[str, torch.Tensor]:
        """Talker hidden states [B, H] -> frames [B, G] and their summed codec embeddings [B, H]."""
        code0 = draw(self.talker.group0_logits(hidden), talker)
        code0_embedding = self.talker.model.codec_embedding(code0)
        rest, rest_sum = self.talker.code_predictor.draw_groups(hidden, code0_embedding, cp)
        return {"frames": torch.cat([code0[:, None], rest], dim=1), "codec_sum": code0_embedding + rest_sum}

    def _commit_frames(
        self, reqs: list[EngineRequest], frames: torch.Tensor, codec_sum: torch.Tensor
    ) -> Callable[[], None]:
        states = [req.state.talker for req in reqs]
        advance([ts.sampler for ts in states], frames[:, 0])
        advance([ts.cp_sampler for ts in states], None, num_drawn=frames.shape[1] - 1)  # (no penalty there)
        copy = HostCopy(frames)  # the step's one read, queued now
        for row, ts in enumerate(states):  # the next row is built from these codes before they are read
            ts.pending, ts.num_inflight = codec_sum[row], ts.num_inflight + 1

        def commit() -> None:
            host = copy.get()
            for row, req in enumerate(reqs):
                req.state.talker.num_inflight -= 1
                if not (req.status.is_done or req.state.talker.finished):  # else: drawn after codec EOS
                    req.guarded(self._commit_frame, req, host[row])

        return commit

    def capture_graphs(self, storage: KVStorage, pool=None):
        """Capture the prefill layers per layout bucket, and the frame step (talker decode + all
        sampling and code-predictor steps) per batch bucket."""
        cfg = self.talker.cfg
        pool = self.layers.capture(self.prefill, storage, pool)
        if self.graph_max_batch == 0:
            return pool
        names = GRAPH_FIELDS

        def frame_step(x, positions, slots, table, lens, **sampling):
            kv = DecodeKV(storage, slots, table, lens, self.decode_attention)
            hidden = self.talker.model(x, positions.T, kv)
            talker = BatchParams(**{k: sampling[f"talker_{k}"] for k in names})
            cp = BatchParams(**{k: sampling[f"cp_{k}"] for k in names})
            return self._frame_tail(hidden, talker, cp)

        inputs = {
            "x": StaticInput((cfg.text.hidden_size,), self.talker.codec_head.weight.dtype),
            "positions": StaticInput((3,), torch.float32),
            "slots": StaticInput((), torch.long, storage.scratch_slot),
            "table": StaticInput((storage.pool.num_pages,), torch.int32),
            "lens": StaticInput((), torch.int32),
        }
        for prefix, vocab in (("talker", cfg.text.vocab_size), ("cp", cfg.code_predictor.vocab_size)):
            inputs |= {f"{prefix}_{k}": spec for k, spec in _sampling_inputs(vocab).items()}
        buckets = batch_buckets(self.graph_max_batch)
        self.frame_graph = GraphedStep("talker frame", frame_step, inputs, buckets, self.device)
        return self.frame_graph.capture(pool)

    def _graphed_frames(self, batch, x: torch.Tensor, positions: torch.Tensor, kv: PagedBatch) -> Callable[[], None]:
        reqs = [req for req, _, _ in batch]
        states = [req.state.talker for req in reqs]
        cfg = self.talker.cfg
        inputs = {"x": x, "positions": positions.T, **kv.decode_inputs()}
        for prefix, samplers, vocab in (
            ("talker", [ts.sampler for ts in states], cfg.text.vocab_size),
            ("cp", [ts.cp_sampler for ts in states], cfg.code_predictor.vocab_size),
        ):
            params = BatchParams.of(samplers, vocab, self.device)  # (fields it leaves out: neutral)
            inputs |= {f"{prefix}_{name}": getattr(params, name) for name in GRAPH_FIELDS}
        out = self.frame_graph.run(len(batch), inputs)
        kv.advance(len(batch))  # (the graph's DecodeKV keeps no host bookkeeping)
        return self._commit_frames(reqs, out["frames"], out["codec_sum"].clone())  # (graph outputs are reused)

    @staticmethod
    def _frame_rows(batch: list[Chunk]) -> list[bool]:
        """Rows that run one input row and then draw a frame: the last input row already there,
        or the new frame row ``run`` builds (the captured graph's work)."""
        rows = []
        for req, start, n in batch:
            ts = req.state.talker
            new = start + n - ts.num_inputs  # 1: the row is the new one, built in the step
            rows.append(n == 1 and ts.prefix is not None and new >= 0 and ts.num_frames == len(ts.rows) + new)
        return rows

    def graph_rows(self, batch: list[Chunk]) -> list[bool]:
        return rows_in_graph(self.frame_graph, self._frame_rows(batch))

    def graph_batch(self) -> int:
        return graph_batch(self.frame_graph)

    def stats(self) -> dict:
        replays = self.frame_graph.num_replays if self.frame_graph else 0
        return {"graph_replays": replays, "eager_decode_steps": self.num_eager_decode_steps, **self.layers.stats()}

    def _commit_frame(self, req: EngineRequest, frame: torch.Tensor) -> None:
        """Keep the frame unless group 0 is codec EOS; stop at EOS or the frame limit (``frame_limit``). (What the
        next step already did from this frame's codes is dropped with the request's pages.)"""
        ts = req.state.talker
        if int(frame[0]) == self.talker.cfg.codec.eos:
            ts.finished = True
            return
        ts.frames.append(frame)
        ts.finished = len(ts.frames) >= self._frame_limit(req)


def _sampling_inputs(vocab: int) -> dict[str, StaticInput]:
    """``BatchParams`` fields as static graph inputs; padding rows are neutral and greedy."""
    return {
        "temperature": StaticInput((), torch.float32, 1.0),
        "penalty": StaticInput((), torch.float32, 1.0),
        "seen": StaticInput((vocab,), torch.bool),
        "banned": StaticInput((vocab,), torch.bool),
        "top_k": StaticInput((), torch.long, vocab),
        "top_p": StaticInput((), torch.float32, 1.0),
        "sampled": StaticInput((), torch.bool),
        "seeds": StaticInput((), torch.long),
        "steps": StaticInput((), torch.long),
    }
