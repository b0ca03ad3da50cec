"""CUDA graphs of a KV stage's prefill forward (prompt chunks of many requests over paged KV).

Eager, a prefill forward launches thousands of small kernels (~2.6k for a 48-layer MoE LM), and the
host time to launch them bounds busy steps (docs/performance.md). A graph
replays them at the cost of one launch. Its shapes are fixed, so a step's layout is padded to a
``Bucket`` (``packed_graphs``: tokens T, segments S, longest segment M) and its keys to K = 2T:

    queries   the real chunks | padding pieces of <= M tokens        | empty segments
    keys      each chunk's cached + new keys | each piece's own keys | empty; the rest of the
              K key slots (the scratch slot) lies after the last segment and is never attended
    new keys  each chunk's slots | the scratch slot for every padding token

Padding tokens attend only to padding keys (the scratch slot) and every other op is row-wise, so
the real rows are what the unpadded forward computes (to float rounding: GEMMs see other row
counts). A layout fits a bucket when its chunks fit (T, S, M) and its cached keys are at most T
(a first chunk, or a later one no longer than those before it). One that fits none runs eagerly,
counted. Buckets stop at the stage's token budget: a step never holds more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from omniwalk.device import to_device
from omniwalk.engine.cuda_graphs import KeyedGraphs, StaticInput, fill_static
from omniwalk.engine.kv_pages import KVStorage
from omniwalk.engine.packed_graphs import Bucket, layout_buckets, padded_lengths, pick_bucket
from omniwalk.engine.paged_attention import PagedBatch, Segment
from omniwalk.layers.attention import cu_seqlens, varlen_attention

KEYS_PER_TOKEN = 2  # K = 2T key slots per bucket
SHORTEST_COMMON_CHUNK = 128  # fewer tokens per chunk is uncommon (a short prompt, a re-fed speech row)


class PrefillKV:
    """KV context of a padded prefill step: slot and offset tensors of fixed shapes (graphable)."""

    def __init__(self, storage: KVStorage, new_slots, key_slots, cu_q, cu_k, max_q: int, max_k: int, backend: str):
        self.storage, self.new_slots, self.key_slots, self.cu_q, self.cu_k = storage, new_slots, key_slots, cu_q, cu_k
        self.max_q, self.max_k, self.backend = max_q, max_k, backend

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = self.storage.keys[layer], self.storage.values[layer]
        keys.index_copy_(0, self.new_slots, k.to(keys.dtype))
        values.index_copy_(0, self.new_slots, v.to(values.dtype))
        return varlen_attention(
            q,
            keys[self.key_slots],
            values[self.key_slots],
            self.cu_q,
            self.max_q,
            causal=True,
            scale=q.shape[-1] ** -0.5,
            backend=self.backend,
            cu_seqlens_k=self.cu_k,
            max_seqlen_k=self.max_k,
        )

    def kv_slots(self, layer: int, num_new: int) -> None:
        return None  # (a fused q/k kernel hands k, v to ``attend``, which stores them)

    def advance(self, num_new: int) -> None:
        pass  # the step's PagedBatch keeps the host bookkeeping


def prefill_buckets(max_tokens: int) -> list[Bucket]:
    """From 128 tokens (one request's short prompt, or the rest of one after its prefix pages, which a
    bucket of 256 would pad to twice its work)."""
    return layout_buckets(max_tokens, None, SHORTEST_COMMON_CHUNK, first=SHORTEST_COMMON_CHUNK)


def fits(bucket: Bucket, kv: PagedBatch) -> bool:
    new = [s.num_new for s in kv.segments]
    cached = sum(s.table.num_cached for s in kv.segments)
    return bucket.fits(new) and cached <= (KEYS_PER_TOKEN - 1) * bucket.num_tokens


def kv_inputs(bucket: Bucket, storage: KVStorage, segments: list[Segment], device) -> dict[str, torch.Tensor]:
    """The bucket's KV tensors for these chunks (see the module docstring's table)."""
    pool, scratch = storage.pool, storage.scratch_slot
    new_slots, key_slots = [], []
    for seg in segments:
        slots = seg.table.slots(pool, 0, seg.table.num_cached + seg.num_new)
        key_slots += slots
        new_slots += slots[seg.table.num_cached :]
    q = padded_lengths([s.num_new for s in segments], bucket)
    k = [s.table.num_cached + s.num_new for s in segments] + q[len(segments) :]
    new_slots += [scratch] * (bucket.num_tokens - len(new_slots))
    key_slots += [scratch] * (KEYS_PER_TOKEN * bucket.num_tokens - len(key_slots))
    return {
        "new_slots": to_device(new_slots, device, torch.long),
        "key_slots": to_device(key_slots, device, torch.long),
        "cu_q": cu_seqlens(q, device),
        "cu_k": cu_seqlens(k, device),
    }


@dataclass(frozen=True)
class PrefillPlan:
    """A KV program's prefill graphs: buckets up to ``max_tokens`` (0: none) over ``attention``
    (a packed varlen backend; the reference one reads segment bounds on the host)."""

    max_tokens: int = 0
    attention: str = "reference"

    def graphs(self, name: str, fn: Callable[..., dict], specs: dict[str, StaticInput], storage, device):
        return PrefillGraphs(name, fn, specs, storage, self.attention, self.max_tokens, device)


NO_PREFILL_GRAPHS = PrefillPlan()


class PrefillGraphs:
    """Graphs of ``fn(kv: PrefillKV, **rows) -> dict of [T, ...]`` per bucket; ``specs`` are the
    row inputs (per-row shape, dtype, pad value). Nothing is captured until ``capture``."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., dict],
        specs: dict[str, StaticInput],
        storage: KVStorage,
        backend: str,
        max_tokens: int,
        device,
    ):
        self.name, self.fn, self.specs, self.storage, self.backend = name, fn, specs, storage, backend
        self.buckets, self.device = prefill_buckets(max_tokens), device
        self.captured: KeyedGraphs | None = None
        self.num_eager_steps = 0  # prefill forwards that fit no bucket while graphs were on

    def capture(self, pool=None):
        if not self.buckets:
            return pool
        knob = "prefill_graph_max_tokens (0 = prefill runs eagerly)"
        self.captured = KeyedGraphs(f"{self.name} prefill", self._step, self._empty, self.buckets, self.device, knob)
        return self.captured.capture(pool)

    def _step(self, bucket: Bucket, new_slots, key_slots, cu_q, cu_k, **rows) -> dict:
        max_k = KEYS_PER_TOKEN * bucket.num_tokens
        kv = PrefillKV(self.storage, new_slots, key_slots, cu_q, cu_k, bucket.max_seqlen, max_k, self.backend)
        return self.fn(kv, **rows)

    def _empty(self, bucket: Bucket) -> dict[str, torch.Tensor]:
        """All padding: a valid layout to warm up and record on."""
        rows = {
            k: torch.full((bucket.num_tokens, *s.shape), s.pad, dtype=s.dtype, device=self.device)
            for k, s in self.specs.items()
        }
        return {**kv_inputs(bucket, self.storage, [], self.device), **rows}

    def pick(self, kv: PagedBatch) -> Bucket | None:
        """The bucket this step's prefill replays in (None: run it eagerly, counted)."""
        if self.captured is None or kv.is_decode:
            return None
        bucket = pick_bucket([b for b in self.buckets if fits(b, kv)], [s.num_new for s in kv.segments])
        self.num_eager_steps += bucket is None
        return bucket

    def run(self, bucket: Bucket, kv: PagedBatch, rows: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Replay over the padded step; outputs are static buffers of T rows (the real ones first),
        valid until that bucket's next replay. A row input given as None is all padding."""
        static = self.captured.graphs[bucket][1]
        for name, x in kv_inputs(bucket, self.storage, kv.segments, self.device).items():
            static[name].copy_(x)
        fill_static(static, self.specs, rows, kv.num_tokens)
        return self.captured.replay(bucket)

    def stats(self) -> dict:
        return {
            "prefill_graph_replays": self.captured.num_replays if self.captured else 0,
            "eager_prefill_steps": self.num_eager_steps,
        }


def prefill_layers(
    graphs: PrefillGraphs | None, eager: Callable[..., dict], kv: PagedBatch, rows: dict[str, torch.Tensor | None]
) -> dict[str, torch.Tensor]:
    """A prefill step's rows through a program's layers: replayed in the bucket its layout fits (the
    outputs cut to its real rows), else ``eager(kv, **rows)``, as the graphs' ``fn`` is called."""
    bucket = graphs.pick(kv) if graphs is not None else None
    if bucket is None:
        return eager(kv, **rows)
    out = graphs.run(bucket, kv, rows)
    n = kv.num_tokens
    kv.advance(n)  # (the graph's PrefillKV keeps no host bookkeeping)
    return {name: t[:n] for name, t in out.items()}


class DecoderPrefill:
    """A decoder's layers over a prefill step's rows, x [n, hidden] at MRoPE positions [n, 3] -> its final-normed
    hidden states [n, hidden]: replayed from a graph of the padded layout once ``capture``d (per ``plan``
    bucket), else eager. What a talker program runs for its prefill chunks (the thinker keeps its own: it
    takes DeepStack rows and taps a layer)."""

    def __init__(self, name: str, decoder: torch.nn.Module, device):
        self.name, self.decoder, self.device = name, decoder, device
        self.graphs: PrefillGraphs | None = None

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, kv: PagedBatch) -> torch.Tensor:
        rows = {"x": x, "positions": to_device(positions, self.device)}
        return prefill_layers(self.graphs, self._step, kv, rows)["hidden"]

    def _step(self, kv, x: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden": self.decoder(x, positions.T, kv)}

    def capture(self, plan: PrefillPlan, storage: KVStorage, pool=None):
        row = StaticInput((self.decoder.cfg.hidden_size,), self.decoder.norm.weight.dtype)
        specs = {"x": row, "positions": StaticInput((3,), torch.float32)}
        self.graphs = plan.graphs(self.name, self._step, specs, storage, self.device)
        return self.graphs.capture(pool)

    def stats(self) -> dict:
        return self.graphs.stats() if self.graphs is not None else {}
