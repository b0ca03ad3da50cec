"""Engine program for the thinker: packed prefill chunks and decode tokens of many requests.

A request's tokens are ``seq`` = prompt + generated ids read back, then ``inflight``: ids sampled
by the step before, still on the device (the host reads them one step late). The KV holds a
prefix of the two, and a step runs the next ready tokens (``num_ready``); tokens still in flight
are copied into the step's input ids on the device. When a request's chunk reaches the end its
next token is sampled (so prefill, decode and recompute after preemption are one code path). A
stop found when a token is read back ends the request; the token the next step sampled after it
is dropped (and its KV slot goes with the request's pages), so outputs equal a synchronous loop.
Media rows for a chunk are the encoder rows of the placeholders inside it.

A step in which every request decodes one generated token (no prompt rows, so no media) replays a
CUDA graph of the whole forward when one was captured for its batch size; besides the logits it
returns the per-row tensors the program declares in ``graph_outputs`` (what its ``keep_rows`` reads
of a decode row), and ``keep_rows`` sees its rows as it sees eager ones.
Other steps (prompt chunks) embed eagerly (media rows scattered in), then replay a graph of the
decoder layers for their padded layout (``engine/prefill_graphs.py``) when one fits.

With LoRA adapters (``adapters``: ``programs/adapters.py``), a request naming one holds its pool slot
before it runs, and each forward takes its rows' slots (-1: base), a graph input of the decode and
prefill graphs; an eager step whose rows are all base runs without them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np
import torch

from omniwalk.device import to_device
from omniwalk.engine.cuda_graphs import GraphedStep, StaticInput, batch_buckets, graph_batch, rows_in_graph
from omniwalk.engine.inflight import Deferred
from omniwalk.engine.kv_pages import KVStorage
from omniwalk.engine.kv_stage import KVProgram
from omniwalk.engine.paged_attention import DecodeKV, PagedBatch
from omniwalk.engine.prefill_graphs import NO_PREFILL_GRAPHS, PrefillGraphs, PrefillPlan, prefill_layers
from omniwalk.engine.request import Chunk, EngineRequest
from omniwalk.layers.decoder import DecoderConfig
from omniwalk.modality import MEDIA, Modality
from omniwalk.models.common.networks.thinker import MediaEmbeddings, Thinker
from omniwalk.models.common.processing.positions import batch_spans
from omniwalk.models.common.programs.adapters import ThinkerAdapters, row_slots
from omniwalk.models.common.programs.prefix_keys import prefix_chain
from omniwalk.models.common.programs.request_state import ThinkerState
from omniwalk.sampling import TokenLogprob, sample_async
from omniwalk.structured.matchers import bitmask


def kv_storage(cfg: DecoderConfig, budget: int, page_size: int, dtype, device, row_width: int = 0) -> KVStorage:
    """Paged KV storage for a decoder's layers within ``budget`` bytes (``row_width``: ``KVStorage.rows``)."""
    return KVStorage.from_budget(
        budget, page_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, device, row_width
    )


class ThinkerProgram(KVProgram):
    # What ``keep_rows`` reads of a decode row, returned per row by the decode graph: "x" (the input
    # embeddings) and "hidden" (the final-normed hidden states). None by default: the talker reads
    # only prompt rows, which never run in the decode graph.
    graph_outputs: tuple[str, ...] = ()

    def __init__(
        self,
        thinker: Thinker,
        device,
        decode_attention: str = "reference",
        graph_max_batch: int = 0,
        prefill: PrefillPlan = NO_PREFILL_GRAPHS,
        deepstack_levels: int = 0,
        adapters: ThinkerAdapters | None = None,
        keeps_prompt_rows: bool = False,
    ):
        """``keeps_prompt_rows``: every prompt row's input embedding and accept-layer state is stored at
        its KV slot (the storage's ``rows``, 2 x hidden wide), so that a speaking request, whose talker
        reads them, may take keyed prefix pages too (the same on every tensor-parallel rank)."""
        self.thinker, self.device, self.decode_attention = thinker, device, decode_attention
        self.adapters, self.keeps_prompt_rows = adapters, keeps_prompt_rows
        t = thinker.tokens
        self.pad_ids = {"audio": t.audio_pad, "image": t.image_pad, "video": t.video_pad}
        self.graph_max_batch, self.prefill, self.deepstack_levels = graph_max_batch, prefill, deepstack_levels
        self.decode_graph: GraphedStep | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.num_eager_decode_steps = 0  # pure decode steps too large for every captured graph

    def capture_graphs(self, storage: KVStorage, pool=None):
        """Capture the decode forward for every batch bucket up to ``graph_max_batch``, and the
        decoder layers of prefill steps per layout bucket up to ``prefill.max_tokens``."""
        hidden = self.thinker.cfg.hidden_size
        specs = {
            "x": StaticInput((hidden,), self.thinker.lm_head.weight.dtype),
            "positions": StaticInput((3,), torch.float32),
            "deepstack": StaticInput((self.deepstack_levels, hidden), self.thinker.lm_head.weight.dtype),
            **self._lora_input(),
        }
        self.prefill_graphs = self.prefill.graphs("thinker", self._decoder, specs, storage, self.device)
        pool = self.prefill_graphs.capture(pool)
        if self.graph_max_batch == 0:
            return pool

        def decode(ids, positions, slots, table, lens, lora_slots=None):
            kv = DecodeKV(storage, slots, table, lens, self.decode_attention)
            x, _ = self.thinker.embed(ids)  # (no media in decode rows)
            out = {"x": x, "hidden": self.thinker.model(x, positions.T, kv, lora=self._lora(lora_slots))}
            return {"logits": self.thinker.lm_head(out["hidden"]), **{k: out[k] for k in self.graph_outputs}}

        inputs = {
            "ids": StaticInput((), torch.long),
            "positions": StaticInput((3,), torch.float32),
            "slots": StaticInput((), torch.long, storage.scratch_slot),
            "table": StaticInput((storage.pool.num_pages,), torch.int32),
            "lens": StaticInput((), torch.int32),
            **self._lora_input(),
        }
        buckets = batch_buckets(self.graph_max_batch)
        self.decode_graph = GraphedStep("thinker decode", decode, inputs, buckets, self.device)
        return self.decode_graph.capture(pool)

    def _lora_input(self) -> dict[str, StaticInput]:
        """The rows' adapter slots as a graph input (padding rows: -1, the base model), with adapters."""
        return {"lora_slots": StaticInput((), torch.int32, -1)} if self.adapters is not None else {}

    def _lora(self, slots: torch.Tensor | None):
        return None if slots is None else self.adapters.rows(slots)

    @staticmethod
    def _decode_rows(batch: list[Chunk]) -> list[bool]:
        """Rows that decode their one next generated token (the captured graph's work: no prompt
        rows, so no media)."""
        return [
            n == 1 and req.state.thinker.prompt.num_prompt_tokens <= start == req.state.thinker.num_tokens - 1
            for req, start, n in batch
        ]

    def graph_rows(self, batch: list[Chunk]) -> list[bool]:
        return rows_in_graph(self.decode_graph, self._decode_rows(batch))

    def graph_batch(self) -> int:
        return graph_batch(self.decode_graph)

    def stats(self) -> dict:
        graph, prefill = self.decode_graph, self.prefill_graphs.stats() if self.prefill_graphs else {}
        replays = graph.num_replays if graph else 0
        lora = self.adapters.stats() if self.adapters is not None else {}
        return {"graph_replays": replays, "eager_decode_steps": self.num_eager_decode_steps, **prefill, **lora}

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        st = req.state.thinker
        if st.is_finished or st.num_sampled >= st.max_tokens:  # (the last one may still be in flight)
            return 0
        if st.forced_answer is not None and st.num_sampled:  # its commit replaces that draw: nothing to decode
            return 0
        grammar = st.sampler.grammar
        if grammar is not None and grammar.matcher is None:  # its grammar still compiling
            try:
                if not grammar.is_ready():
                    return 0
                grammar.take()
            except Exception as e:  # noqa: BLE001 - a grammar that fails (or is late) fails its request alone
                req.fail(e)
                return 0
        if num_cached < st.prompt.num_prompt_tokens and st.prompt.spans and not self._has_media(req, num_cached):
            return 0
        n = st.num_tokens - num_cached
        return n if n == 0 or req.state.thinker.lora is None or self.adapters.holds_slot(req) else 0

    def _has_media(self, req: EngineRequest, num_cached: int) -> bool:
        """Whether the rows of every item that the prompt past ``num_cached`` needs are encoded. Items
        skipped for a prefix that keyed pages no longer hold are asked of the encoders again."""
        st, media = req.state.thinker, req.state.media
        if num_cached < media.skip_end:
            media.skip(st.prompt.spans, num_cached)
            st.media = None  # (assembled again with them)
        if not media.is_encoded:
            return False
        if st.placeholders_before is None:
            ids = np.asarray(st.prompt.token_ids)
            st.placeholders_before = {k: np.concatenate([[0], np.cumsum(ids == p)]) for k, p in self.pad_ids.items()}
        return True

    def expect_prefix(self, req: EngineRequest, num_tokens: int) -> None:
        """The encoders skip the items under the prefix keyed pages hold (their rows are not read)."""
        req.state.media.skip(req.state.thinker.prompt.spans, num_tokens)

    def on_add(self, req: EngineRequest) -> None:
        if req.state.thinker.lora is not None:
            self.adapters.join(req.state.thinker)

    def on_remove(self, req: EngineRequest) -> None:
        if req.state.thinker.lora is not None:
            self.adapters.leave(req.state.thinker)

    def is_finished(self, req: EngineRequest) -> bool:
        return req.state.thinker.is_finished

    def prefix_keys(self, req: EngineRequest, page_size: int) -> list[bytes]:
        """The prompt's full pages before its last token, each keyed by ``prefix_chain`` (every id,
        position and media item's content up to its end; an adapter's pages chained from the key of
        its load, the base's from nothing). None for a request that asked for speech unless the
        program keeps prompt rows (its talker reads them, which taken pages would not compute;
        ``speaks`` is read from the request, so every tensor-parallel rank answers alike)."""
        st = req.state.thinker
        if (req.state.talker is not None or st.speaks) and not self.keeps_prompt_rows:
            return []
        seed = b"" if st.lora_key is None else hashlib.blake2b(st.lora_key.encode(), digest_size=16).digest()
        return prefix_chain(seed, st.prompt, list(range(page_size, st.prompt.num_prompt_tokens, page_size)))

    def on_prefix(self, req: EngineRequest, storage: KVStorage, slots: list[int]) -> None:
        """A speaking request's talker reads the prompt rows its keyed pages hold: from their slots."""
        if req.state.talker is None or storage.rows is None:
            return
        rows = storage.rows[to_device(slots, storage.rows.device, torch.long)]
        x, accept_hidden = rows.chunk(2, dim=1)
        self._keep_prompt_rows(req.state.thinker, 0, len(slots), x, accept_hidden, 0)

    def on_preempt(self, req: EngineRequest) -> None:
        """Nothing to undo: the prompt's talker rows are rewritten identically on recompute."""

    @torch.inference_mode()
    def run(self, batch: list[Chunk], kv: PagedBatch) -> Callable[[], None] | None:
        states = [req.state.thinker for req, _, _ in batch]
        host_ids, in_flight = self._host_ids(batch)
        positions = batch_spans([(st.prompt.rope, s, n) for st, (_, s, n) in zip(states, batch, strict=True)])
        lora_slots = row_slots(batch)
        if all(self._decode_rows(batch)) and self.decode_graph is not None:
            if self.decode_graph.fits(len(batch)):
                inputs = {"ids": np.asarray(host_ids, dtype=np.int64), "positions": positions.T, **kv.decode_inputs()}
                inputs |= {"lora_slots": lora_slots} if lora_slots is not None else {}
                out = self.decode_graph.run(len(batch), inputs, functools.partial(_patch_ids, in_flight))
                kv.advance(len(batch))  # (the graph's DecodeKV keeps no host bookkeeping)
                for row, (req, start, n) in enumerate(batch):
                    self.keep_rows(req, start, n, out.get("x"), out, row)  # (reads outputs before the next replay)
                return self._sample(batch, list(range(len(batch))), out["logits"])
            self.num_eager_decode_steps += 1
        media, counts = self._media(batch)
        x, deepstack = self.thinker.embed(_device_ids(host_ids, in_flight, self.device), media, counts)
        out = self._layers(x, positions.T, deepstack, kv, lora_slots)
        if kv.storage.rows is not None:
            _store_prompt_rows(batch, kv, torch.cat([x, out["accept_hidden"]], dim=1))
        offset, ready, ends = 0, [], []
        for row, (req, start, n) in enumerate(batch):
            self.keep_rows(req, start, n, x, out, offset)
            if start + n == req.state.thinker.num_tokens:  # the chunk reached the end: sample
                ready.append(row)
                ends.append(offset + n - 1)
            offset += n
        if ready:
            logits = self.thinker.lm_head(out["hidden"][to_device(ends, self.device, torch.long)])
            return self._sample(batch, ready, logits)
        return None

    def _layers(self, x, positions, deepstack, kv: PagedBatch, lora_slots=None) -> dict[str, torch.Tensor]:
        """The decoder over a prefill step's embeddings: replayed from a graph when the step's
        layout fits a bucket, else eager."""
        deepstack = deepstack.transpose(0, 1) if deepstack is not None else None  # [n, levels, hidden]: rows first
        rows = {"x": x, "positions": to_device(positions, self.device), "deepstack": deepstack}
        if self.adapters is not None:
            slots = None if lora_slots is None else torch.from_numpy(lora_slots)  # (a tensor: pinned on its way up)
            rows["lora_slots"] = None if slots is None else to_device(slots, self.device)
        return prefill_layers(self.prefill_graphs, self._decoder, kv, rows)

    def _decoder(self, kv, x, positions, deepstack=None, lora_slots=None) -> dict[str, torch.Tensor]:
        """x [n, hidden] at positions [n, 3], DeepStack rows [n, levels, hidden] or None, adapter slots [n]
        or None (all base) -> the final hidden states and the output of layer ``accept_hidden_layer - 1``
        (for the talker)."""
        accept_at, taps = self.thinker.accept_hidden_layer - 1, {}

        def tap(layer: int, h: torch.Tensor) -> torch.Tensor:
            taps.update({"accept_hidden": h} if layer == accept_at else {})
            return h + deepstack[:, layer] if deepstack is not None and layer < deepstack.shape[1] else h

        layers = {accept_at, *range(deepstack.shape[1] if deepstack is not None else 0)}
        hooks = {i: functools.partial(tap, i) for i in layers}
        return {"hidden": self.thinker.model(x, positions.T, kv, hooks, lora=self._lora(lora_slots)), **taps}

    def _sample(self, batch, ready: list[int], logits: torch.Tensor) -> Callable[[], None] | Deferred:
        """Draw the next token of the ``ready`` rows of the batch (``logits`` [len(ready), vocab]);
        the returned function reads the picks back and commits them. When a row's output follows a
        grammar, its bitmask needs the row's last token committed: the draw is deferred until the
        step before is (``engine/inflight.py``), into ids the next step already reads from."""
        samplers = [batch[row][0].state.thinker.sampler for row in ready]
        grammars = [s.grammar for s in samplers]
        if any(grammars):
            ids = torch.empty(len(ready), dtype=torch.long, device=logits.device)
            drawn = []

            @torch.inference_mode()
            def launch() -> None:
                allowed = to_device(torch.from_numpy(bitmask(grammars)), logits.device)
                drawn.append(sample_async(logits, samplers, allowed))
                ids.copy_(drawn[0].ids)

            picks = lambda: drawn[0]()  # noqa: E731
        else:
            picks = sample_async(logits, samplers)
            ids = picks.ids
        for i, row in enumerate(ready):
            batch[row][0].state.thinker.inflight.append((ids, i))

        def commit() -> None:
            for row, pick in zip(ready, picks(), strict=True):
                req = batch[row][0]
                req.state.thinker.inflight.pop(0)
                if req.status.is_done or req.state.thinker.is_finished:  # sampled after a stop: dropped
                    continue
                # A forced answer (speech of a given text) replaces the first draw, whole: no decode steps.
                for given in _forced_picks(req.state.thinker) or [pick]:
                    req.guarded(self._commit, req, given)

        return Deferred(launch, commit) if any(grammars) else commit

    @staticmethod
    def _host_ids(batch) -> tuple[list[int], list[tuple[torch.Tensor, list[int], list[int]]]]:
        """The step's input ids on the host, 0 where an id is still in flight, and those: (the draw
        that made them, [their positions in the step], [their rows in the draw])."""
        host, patches = [], {}  # id(draw) -> (draw, [positions in the step], [rows of the draw])
        for req, start, n in batch:
            st = req.state.thinker
            host += st.seq[start : start + n]
            for draw, row in st.inflight[max(start - len(st.seq), 0) : start + n - len(st.seq)]:
                where = patches.setdefault(id(draw), (draw, [], []))
                where[1].append(len(host))
                where[2].append(row)
                host.append(0)
        return host, list(patches.values())

    def _media(self, batch) -> tuple[MediaEmbeddings | None, dict[str, int]]:
        """Encoder rows for the placeholders inside each request's chunk, packed in batch order,
        and how many placeholders of each kind the batch holds (known on the host)."""
        parts: dict[str, list] = {k: [] for k in MEDIA}
        deep: dict[str, list] = {k: [] for k in (Modality.IMAGE, Modality.VIDEO)}
        for req, start, n in batch:
            st = req.state.thinker
            if start >= st.prompt.num_prompt_tokens:
                continue
            if st.media is None:  # (on the device's one stream, after the encoders' rows: engine/inflight.py)
                st.media = _moved(req.state.media.embeddings(), self.device)
            if st.media is None:
                continue
            end = min(start + n, st.prompt.num_prompt_tokens)
            for kind in MEDIA:
                before = st.placeholders_before[kind]
                skipped = int(before[req.state.media.skip_end])  # (the rows start past the skipped items')
                a, b = int(before[start]) - skipped, int(before[end]) - skipped
                if b > a:
                    parts[kind].append(st.media.rows[kind][a:b])
                    if kind in st.media.deepstack:
                        deep[kind].append(st.media.deepstack[kind][:, a:b])
        counts = {k: sum(p.shape[0] for p in v) for k, v in parts.items()}
        if not any(counts.values()):
            return None, counts
        rows = {k: torch.cat(v) for k, v in parts.items() if v}
        return MediaEmbeddings(rows, {k: torch.cat(v, dim=1) for k, v in deep.items() if v}), counts

    def keep_rows(self, req: EngineRequest, start: int, n: int, x, out: dict, offset: int) -> None:
        """Keep what a downstream stage reads of this chunk (rows ``offset`` .. + n of the step's
        embeddings ``x`` and decoder outputs ``out``): by default (a talker fed the prompt's
        embeddings and accept-layer states), the prompt's; a family overrides it. Decode graph rows
        come here too, ``out`` holding ``graph_outputs``."""
        if req.state.talker is not None and start < req.state.thinker.prompt.num_prompt_tokens:
            self._keep_prompt_rows(req.state.thinker, start, n, x, out["accept_hidden"], offset)

    @staticmethod
    def _keep_prompt_rows(st: ThinkerState, start: int, n: int, x, accept_hidden, offset: int) -> None:
        num_prompt = st.prompt.num_prompt_tokens
        if st.prompt_embeddings is None:
            st.prompt_embeddings = x.new_empty((num_prompt, x.shape[1]))
            st.prompt_accept_hidden = accept_hidden.new_empty((num_prompt, x.shape[1]))
        end = min(start + n, num_prompt)
        st.prompt_embeddings[start:end] = x[offset : offset + end - start]
        st.prompt_accept_hidden[start:end] = accept_hidden[offset : offset + end - start]

    @staticmethod
    def _commit(req: EngineRequest, pick: TokenLogprob) -> None:
        """Take the sampled token; stream the text that can no longer turn into a stop string."""
        st = req.state.thinker
        if st.sampler.grammar is not None:
            st.sampler.grammar.accept(pick.token_id)
        if pick.token_id == st.tool_call_start and st.tool_call_at is None:
            st.tool_call_at = st.num_generated
        st.picks.append(pick)
        st.seq.append(pick.token_id)
        detok, stops = st.detok, st.params.stop
        if st.sampler.is_stop_token(pick.token_id):
            final, reason = detok.text + detok.flush(), "stop"
        else:
            detok.add([pick.token_id])
            cut = _find_stop(detok.text, stops)
            if cut is not None:
                final, reason = detok.text[:cut], "stop"
            elif st.num_generated == st.max_tokens:
                final, reason = detok.text + detok.flush(), "length"
            else:
                final, reason = detok.text[: len(detok.text) - _stop_prefix_length(detok.text, stops)], None
        if len(final) > len(st.text):
            req.emit("text", final[len(st.text) :])
            st.text = final
        st.finish_reason = reason


def _moved(media: MediaEmbeddings | None, device) -> MediaEmbeddings | None:
    """Encoder rows on the thinker's device: the hand-off from an encoder placed on another GPU is a
    device-to-device copy queued here, on the consuming stage's side (no copy on the same device)."""
    if media is None:
        return None
    move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
    return MediaEmbeddings(
        {k: move(v) for k, v in media.rows.items()}, {k: move(v) for k, v in media.deepstack.items()}
    )


def _forced_picks(st: ThinkerState) -> list[TokenLogprob] | None:
    """The state's forced answer as picks (consumed: it is taken once, where the first token would be)."""
    forced, st.forced_answer = st.forced_answer, None
    return None if forced is None else [TokenLogprob(token_id, 0.0) for token_id in forced]


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that begins some stop string (held back from the stream)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _device_ids(host: list[int], in_flight: list, device) -> torch.Tensor:
    """The step's input ids [tokens] on the device: ``host`` copied up, ids in flight copied over
    from the draws that made them (device to device)."""
    ids = to_device(host, device, torch.long)
    for draw, where, rows in in_flight:
        ids.index_copy_(0, to_device(where, device, torch.long), draw[to_device(rows, device, torch.long)])
    return ids


def _store_prompt_rows(batch: list[Chunk], kv: PagedBatch, rows: torch.Tensor) -> None:
    """The step's prompt rows (``rows`` [step rows, width]) into the storage's rows at their slots,
    where a later request that takes these pages as its prefix reads them (``on_prefix``)."""
    slots, index, offset = [], [], 0
    for (req, start, n), segment in zip(batch, kv.segments, strict=True):
        end = min(start + n, req.state.thinker.prompt.num_prompt_tokens)
        if end > start:
            slots += segment.table.slots(kv.storage.pool, start, end)
            index += range(offset, offset + end - start)
        offset += n
    if slots:
        device = kv.storage.rows.device
        picked = rows[to_device(index, device, torch.long)].to(kv.storage.rows.dtype)
        kv.storage.rows.index_copy_(0, to_device(slots, device, torch.long), picked)


def _patch_ids(in_flight: list, static: dict) -> None:
    """A decode graph's ids in flight, copied into its static ids from their draws: one slice copy
    per run of consecutive positions taking consecutive rows (a steady batch: one per draw)."""
    ids = static["ids"]
    for draw, where, rows in in_flight:
        start = 0
        for i in range(1, len(where) + 1):
            if i == len(where) or where[i] != where[i - 1] + 1 or rows[i] != rows[i - 1] + 1:
                ids[where[start] : where[i - 1] + 1].copy_(draw[rows[start] : rows[i - 1] + 1])
                start = i
