"""Engine program for Qwen2.5-Omni's talker on a KV stage: one codec stream per request.

A speech request's talker inputs, as HF's ``Qwen2_5OmniForConditionalGeneration.generate`` lays
them out (P = prompt length; S = the reply stream: the thinker's reply rows r(g_0), r(g_1), ...
for every generated token it fed back except the last, then the text-eos embedding, then the
text-pad embedding forever):

    index       row (thinker width)                            TMRoPE position
    0 .. P-1    prompt rows (last hidden + embedding)          the thinker prompt's
    P           embed(speaker's text bos) + codec(pad)         P + delta
    P + 1       S[0] + codec(bos)                              P + 1 + delta
    P + 2 + k   codec(c_k) + S[k + 1]                          P + 2 + k + delta

(the batched path of HF 5.24: the codec pad/bos embeddings and TMRoPE positions are present).
The code after input i >= P + 1 is drawn from its logits, codec bos suppressed, with repetition
penalty over [codec mask] * P + [pad, bos] + the codes so far; codec pad and codec eos end the
stream. Codes token2wav cannot speak (ids past its codec table, ``num_codes``) are suppressed
too: HF's token2wav would fail on one (an index past its embedding); trained weights never draw
them, random ones do (3% of the 7B talker's vocabulary). S[j] is ready once the thinker
committed g_j and g_j is not its last token, or the
thinker finished (then S is cut to its final length). Codes drawn but not read back feed the next
input from the device; a stop read one step late drops what the step after it drew.

A step in which every request runs one input and draws its code (steady speech) replays a CUDA
graph of the projection, the talker decode and the codec head (suppressed codes masked) when one was
captured for its batch size; the draw itself stays eager (``sample_async``, as in other steps: the
repetition penalty's seen masks live per request). Other steps replay a graph of the decoder layers
for their padded layout when one fits (``engine/prefill_graphs.py``).

A stream ends at codec pad or eos, or at the request's code limit (``code_limit``): its
``max_audio_frames``, cut to the speech cap of the answer's text once that is complete
(``config.SpeechCap``: random weights rarely draw a stop code), never below its ``min_audio_frames``.

The hand-over to token2wav is host-side: ``_commit`` appends each code it reads back to the
request's ``Token2WavState.codes`` (``TalkerState.token2wav``) and sets its ``finished`` when the
talker finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from omniwalk.config import SpeechCap
from omniwalk.device import to_device
from omniwalk.engine.cuda_graphs import GraphedStep, StaticInput, batch_buckets, graph_batch, rows_in_graph
from omniwalk.engine.kv_pages import KVStorage
from omniwalk.engine.kv_stage import KVProgram
from omniwalk.engine.paged_attention import DecodeKV, PagedBatch
from omniwalk.engine.prefill_graphs import NO_PREFILL_GRAPHS, DecoderPrefill, PrefillPlan
from omniwalk.engine.request import Chunk, EngineRequest
from omniwalk.models.common.processing.positions import batch_spans
from omniwalk.models.qwen2_5_omni.checkpoint.config import TalkerConfig
from omniwalk.models.qwen2_5_omni.networks.talker import Talker
from omniwalk.models.qwen2_5_omni.programs.token2wav_program import Token2WavState
from omniwalk.sampling import SamplerState, sample_async

CODES_PER_S = 50.0  # codec ids per second of speech: token2wav's DiT takes 2 mel frames each, BigVGAN 240 samples


@dataclass
class TalkerState:
    sampler: SamplerState  # codec pad / eos stop; penalty history starts with the prompt's codec ids
    speaker_bos: int  # the speaker's text bos (a thinker id)
    max_codes: int  # the request's max_audio_frames
    token2wav: Token2WavState  # the codes' consumer (voice, noise seed, ODE steps)
    prompt_rows: torch.Tensor | None = None  # [P, thinker hidden], written as the thinker's prefill runs
    reply: list[torch.Tensor] = field(default_factory=list)  # r(g_j) [thinker hidden], as the thinker feeds g_j
    inputs: list[torch.Tensor] = field(default_factory=list)  # talker input rows built so far (prompt rows aside)
    draws: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # every code drawn: (device ids, row)
    codes: list[int] = field(default_factory=list)  # codes read back (committed), stop code excluded
    finished: bool = False

    def keep_prompt(self, start: int, num_prompt: int, rows: torch.Tensor) -> None:
        if self.prompt_rows is None:
            self.prompt_rows = rows.new_empty((num_prompt, rows.shape[1]))
        self.prompt_rows[start : start + rows.shape[0]] = rows

    def keep_reply(self, j: int, row: torch.Tensor) -> None:
        self.reply[j : j + 1] = [row]  # (a recomputed token writes its row again)


def code_limit(st: TalkerState, th, cap: SpeechCap) -> int:
    """The codes a request may draw: its ``max_audio_frames``, and once its answer's text is complete
    (``th.speech_ended``) at most the text's speech cap, never below its ``min_audio_frames``."""
    capped = cap.max_frames(len(th.spoken), CODES_PER_S) if th.speech_ended else None
    limit = st.max_codes if capped is None else min(st.max_codes, capped)
    return max(limit, st.sampler.params.min_tokens)


class TalkerProgram(KVProgram):
    def __init__(
        self,
        talker: Talker,
        thinker,
        cfg: TalkerConfig,
        device,
        num_codes: int,
        decode_attention: str = "reference",
        graph_max_batch: int = 0,
        prefill: PrefillPlan = NO_PREFILL_GRAPHS,
        speech_cap: SpeechCap | None = None,
    ):
        """``num_codes``: token2wav's codec ids are [0, num_codes); ``speech_cap``: ModelConfig.speech_cap."""
        self.talker, self.thinker, self.cfg, self.device = talker, thinker, cfg, device
        self.speech_cap = speech_cap or SpeechCap()
        self.decode_attention, self.graph_max_batch, self.prefill = decode_attention, graph_max_batch, prefill
        self.decode_graph: GraphedStep | None = None
        self.layers = DecoderPrefill("talker", talker.model, device)  # (prefill chunks)
        self.num_eager_decode_steps = 0  # decode steps too large for every captured graph
        vocab = talker.codec_head.out_features
        unspeakable = [i for i in range(num_codes, vocab) if i not in (cfg.codec_pad, cfg.codec_eos)]
        self.suppressed = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.suppressed[to_device([cfg.codec_bos, *unspeakable], device, torch.long)] = True
        embed = thinker.model.embed_tokens
        with torch.inference_mode():
            ids = to_device([cfg.text_eos, cfg.text_pad], device, torch.long)
            self.text_eos, self.text_pad = embed(ids).unbind(0)
            codec = talker.model.embed_tokens(to_device([cfg.codec_pad, cfg.codec_bos], device, torch.long))
            self.codec_pad, self.codec_bos = codec.unbind(0)

    def _stream(self, req: EngineRequest, j: int) -> torch.Tensor | None:
        """S[j], or None while it is not known yet."""
        th, st = req.state.thinker, req.state.talker
        if th.speech_ended:  # (a tool call ends speech as the end of the turn does)
            num_reply = len(th.spoken) - 1
            if j < num_reply:  # (a forced answer's rows come after it is committed)
                return st.reply[j] if j < len(st.reply) else None
            return self.text_eos if j == num_reply else self.text_pad
        return st.reply[j] if j < min(th.num_generated, len(st.reply)) else None

    def _build_inputs(self, req: EngineRequest) -> None:
        """Append every input row that can be built now (see the module docstring)."""
        st, embed = req.state.talker, self.thinker.model.embed_tokens
        if not st.inputs:
            first = self._stream(req, 0)
            if first is None or st.prompt_rows is None:
                return
            bos = embed(to_device([st.speaker_bos], self.device, torch.long))[0]
            st.inputs += [bos + self.codec_pad, first + self.codec_bos]
        while len(st.inputs) - 2 < len(st.draws):
            k = len(st.inputs) - 2
            reply = self._stream(req, k + 1)
            if reply is None:
                return
            ids, row = st.draws[k]
            st.inputs.append(self.talker.model.embed_tokens(ids[row]) + reply)

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        st = req.state.talker
        if st.finished:
            return 0
        if len(st.draws) >= self._code_limit(req):  # (a code in flight ends it at its commit; else the text
            st.finished = st.token2wav.finished = len(st.codes) == len(st.draws)  # ended with codes over its cap)
            return 0
        if req.state.thinker.tool_call_at == 0:  # the answer is a tool call, nothing to say: no audio
            st.finished = st.token2wav.finished = True
            return 0
        with torch.inference_mode():
            self._build_inputs(req)
        num_prompt = req.state.thinker.prompt.num_prompt_tokens
        return num_prompt + len(st.inputs) - num_cached if st.inputs else 0

    def is_finished(self, req: EngineRequest) -> bool:
        return req.state.talker.finished

    def on_preempt(self, req: EngineRequest) -> None:
        """Nothing to undo: inputs are kept, and a recomputed input whose code was drawn draws none."""

    @torch.inference_mode()
    def run(self, batch: list[Chunk], kv: PagedBatch) -> Callable[[], None] | None:
        positions = batch_spans([(req.state.thinker.prompt.rope, start, n) for req, start, n in batch])
        if all(self._decode_rows(batch)) and self.decode_graph is not None:
            if self.decode_graph.fits(len(batch)):
                x = torch.stack(
                    [r.state.talker.inputs[s - r.state.thinker.prompt.num_prompt_tokens] for r, s, _ in batch]
                )
                inputs = {"x": x, "positions": positions.T, **kv.decode_inputs()}
                logits = self.decode_graph.run(len(batch), inputs)["logits"]
                kv.advance(len(batch))  # (the graph's DecodeKV keeps no host bookkeeping)
                return self._sample([req for req, _, _ in batch], logits)
            self.num_eager_decode_steps += 1
        rows, ends, offset = [], [], 0
        for (req, start, n), draws in zip(batch, self._draw_rows(batch), strict=True):
            rows.append(self._rows(req, start, n))
            offset += n
            if draws:
                ends.append((req, offset - 1))
        hidden = self.layers(self.talker.thinker_to_talker_proj(torch.cat(rows)), positions.T, kv)
        if not ends:
            return None
        last = hidden[to_device([i for _, i in ends], self.device, torch.long)]
        return self._sample([req for req, _ in ends], self._logits(last))

    @staticmethod
    def _rows(req: EngineRequest, start: int, n: int) -> torch.Tensor:
        """The chunk's input rows [n, thinker hidden] (before the projection)."""
        st, num_prompt = req.state.talker, req.state.thinker.prompt.num_prompt_tokens
        prompt = st.prompt_rows[start : min(start + n, num_prompt)]
        later = st.inputs[max(start - num_prompt, 0) : max(start + n - num_prompt, 0)]  # (none inside the prompt)
        if not later:
            return prompt
        return torch.cat([prompt, torch.stack(later)]) if len(prompt) else torch.stack(later)

    @staticmethod
    def _draw_rows(batch: list[Chunk]) -> list[bool]:
        """Chunks whose last input draws a code: input i >= P + 1 draws code i - P - 1, unless it
        was drawn before (a recompute)."""
        rows = []
        for req, start, n in batch:
            last, num_prompt = start + n - 1, req.state.thinker.prompt.num_prompt_tokens
            rows.append(last >= num_prompt + 1 and last - num_prompt - 1 == len(req.state.talker.draws))
        return rows

    @classmethod
    def _decode_rows(cls, batch: list[Chunk]) -> list[bool]:
        """Rows that run one input and draw its code (the captured graph's work)."""
        return [n == 1 and draws for (_, _, n), draws in zip(batch, cls._draw_rows(batch), strict=True)]

    def graph_rows(self, batch: list[Chunk]) -> list[bool]:
        return rows_in_graph(self.decode_graph, self._decode_rows(batch))

    def graph_batch(self) -> int:
        return graph_batch(self.decode_graph)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Talker hidden states [B, hidden] -> fp32 codec logits, HF's suppress_tokens (codec bos)
        and the unspeakable codes at -inf."""
        return self.talker.codec_head(hidden).float().masked_fill(self.suppressed, float("-inf"))

    def _sample(self, reqs: list[EngineRequest], logits: torch.Tensor) -> Callable[[], None]:
        """Draw each request's next code; the returned function reads them back and commits them."""
        picks = sample_async(logits, [req.state.talker.sampler for req in reqs])
        for i, req in enumerate(reqs):
            req.state.talker.draws.append((picks.ids, i))

        def commit() -> None:
            for req, pick in zip(reqs, picks(), strict=True):
                req.guarded(self._commit, req, pick.token_id)

        return commit

    def capture_graphs(self, storage: KVStorage, pool=None):
        """Capture the prefill layers per layout bucket, and the decode step (projection, talker
        decode, codec head) per batch bucket up to ``graph_max_batch``."""
        dtype = self.talker.codec_head.weight.dtype
        pool = self.layers.capture(self.prefill, storage, pool)
        if self.graph_max_batch == 0:
            return pool

        def decode(x, positions, slots, table, lens):
            kv = DecodeKV(storage, slots, table, lens, self.decode_attention)
            hidden = self.talker.model(self.talker.thinker_to_talker_proj(x), positions.T, kv)
            return {"logits": self._logits(hidden)}

        inputs = {
            "x": StaticInput((self.cfg.embedding_size,), dtype),
            "positions": StaticInput((3,), torch.float32),
            "slots": StaticInput((), torch.long, storage.scratch_slot),
            "table": StaticInput((storage.pool.num_pages,), torch.int32),
            "lens": StaticInput((), torch.int32),
        }
        buckets = batch_buckets(self.graph_max_batch)
        self.decode_graph = GraphedStep("talker decode", decode, inputs, buckets, self.device)
        return self.decode_graph.capture(pool)

    def stats(self) -> dict:
        replays = self.decode_graph.num_replays if self.decode_graph else 0
        return {"graph_replays": replays, "eager_decode_steps": self.num_eager_decode_steps, **self.layers.stats()}

    def _code_limit(self, req: EngineRequest) -> int:
        return code_limit(req.state.talker, req.state.thinker, self.speech_cap)

    def _commit(self, req: EngineRequest, code: int) -> None:
        st = req.state.talker
        if st.finished or req.status.is_done:  # drawn after a stop: dropped
            return
        if not st.sampler.is_stop_token(code):
            st.codes.append(code)
            st.token2wav.codes.append(code)
        is_last = st.sampler.is_stop_token(code) or len(st.codes) >= self._code_limit(req)
        st.finished = st.token2wav.finished = is_last
