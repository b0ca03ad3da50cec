"""Attention over paged KV for one engine step of many requests (packed along the token axis).

A ``PagedBatch`` is built once per step from the requests' page tables and how many new tokens
each contributes; it is the decoder's ``KVCache`` for that step. Every decoder layer calls
``attend``: the new keys/values are written into their slots, then each request's queries attend
causally to all of its keys: reference path per request, gathered, the same function the
contiguous cache uses; fast path (``prefill_backend``, e.g. ``torch_varlen``) one packed varlen
call for the whole step over every request's gathered keys, the queries bottom-right aligned (a
prompt chunk after its cached tokens). The decoder calls ``advance`` after its last layer.

Slot indices are built on the host from the page tables (plain Python, no device reads) and
copied to the device once per step (a decode step's when first needed: a graph's replay takes them
from the host with its other inputs).

A step in which every request adds exactly one token (pure decode) instead attends through
``DecodeKV``: page table rows, lengths and new slots as tensors, and one batched decode kernel
(the ``decode_attention`` entry of ``DECODE_ATTENTION``) for the whole batch. Its inputs have fixed
shapes, so a decode step can be captured in a CUDA graph over static copies of them (``decode_inputs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omniwalk.device import to_device
from omniwalk.engine.kv_pages import KVStorage, PageTable
from omniwalk.kernels.registry import DECODE_ATTENTION
from omniwalk.layers.attention import cu_seqlens, varlen_attention
from omniwalk.layers.kv_attention import causal_attention


@dataclass
class Segment:
    table: PageTable
    num_new: int


class DecodeKV:
    """KV context of a pure decode step: one new token per row, attended by one batched kernel.

    slots [B] int64 (where each row's new key goes), table [B, pages] int32, lens [B] int32 (keys
    per row including the new one; 0 = a padding row). ``advance`` is a no-op: the page tables'
    host bookkeeping belongs to the ``PagedBatch`` that made the inputs.
    """

    def __init__(self, storage: KVStorage, slots, table, lens, backend: str):
        self.storage, self.slots, self.table, self.lens = storage, slots, table, lens
        self.kernel = DECODE_ATTENTION.load(backend)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values, slots = self.kv_slots(layer, q.shape[0])
        keys.index_copy_(0, slots, k.to(keys.dtype))
        values.index_copy_(0, slots, v.to(values.dtype))
        return self.attend_stored(layer, q)

    def kv_slots(self, layer: int, num_new: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the new keys go (a fused kernel may write them there itself, then ``attend_stored``)."""
        return self.storage.keys[layer], self.storage.values[layer], self.slots

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        keys, values = self.storage.keys[layer], self.storage.values[layer]
        page_size = self.storage.pool.page_size
        return self.kernel(q.contiguous(), keys, values, self.table, self.lens, page_size, self.storage.semaphores)

    def advance(self, num_new: int) -> None:
        pass


class PagedBatch:
    """The decoder's KV context for one step (implements ``attend``/``advance``)."""

    def __init__(
        self,
        storage: KVStorage,
        segments: list[Segment],
        device,
        decode_backend: str = "reference",
        prefill_backend: str = "reference",
    ):
        self.storage, self.segments, self.prefill_backend = storage, segments, prefill_backend
        pool = storage.pool
        new_slots, key_slots = [], []  # key_slots: per segment, the slots of all its keys (host)
        self.is_decode = all(seg.num_new == 1 for seg in segments)
        for seg in segments:
            start = seg.table.num_cached
            if self.is_decode:
                new_slots.extend(seg.table.slots(pool, start, start + 1))
                continue
            key_slots.append(seg.table.slots(pool, 0, start + seg.num_new))
            new_slots.extend(key_slots[-1][start:])
        self.device, self.decode_backend = device, decode_backend
        self._decode: DecodeKV | None = None
        if self.is_decode:  # host arrays: a graph's replay copies them up with its other inputs
            width = max(pool.pages_for(s.table.num_cached + 1) for s in segments)
            table = np.zeros((len(segments), width), dtype=np.int32)
            for row, s in enumerate(segments):
                pages = s.table.pages[:width]
                table[row, : len(pages)] = pages
            self._decode_host = {
                "slots": np.asarray(new_slots, dtype=np.int64),
                "table": table,
                "lens": np.asarray([s.table.num_cached + 1 for s in segments], dtype=np.int32),
            }
            return
        self._new_slots = to_device(new_slots, device, torch.long)
        if prefill_backend == "reference":
            self._keys = [to_device(slots, device, torch.long) for slots in key_slots]
        else:  # one packed call: keys of every segment back to back
            self._packed_keys = to_device([i for slots in key_slots for i in slots], device, torch.long)
            totals = [len(slots) for slots in key_slots]
            self._cu_q = cu_seqlens([s.num_new for s in segments], device)
            self._cu_k = cu_seqlens(totals, device)
            self._max_q, self._max_k = max(s.num_new for s in segments), max(totals)

    @property
    def decode(self) -> DecodeKV | None:
        """A pure decode step's eager KV context (its inputs copied up on first use), else None."""
        if self.is_decode and self._decode is None:
            h = self._decode_host
            up = {k: to_device(torch.from_numpy(v), self.device) for k, v in h.items()}
            self._decode = DecodeKV(self.storage, up["slots"], up["table"], up["lens"], self.decode_backend)
        return self._decode

    def decode_inputs(self) -> dict[str, np.ndarray]:
        """A pure decode step's KV inputs on the host (a ``GraphedStep`` copies them up: slots and
        lengths with its other small inputs, the page table's used columns on their own)."""
        return self._decode_host

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.segments)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [n, heads, d], k/v [n, kv_heads, d] packed in segment order -> out [n, heads, d]."""
        if self.is_decode:
            return self.decode.attend(layer, q, k, v)
        keys, values = self.storage.keys[layer], self.storage.values[layer]
        keys.index_copy_(0, self._new_slots, k.to(keys.dtype))
        values.index_copy_(0, self._new_slots, v.to(values.dtype))
        if self.prefill_backend != "reference":
            return varlen_attention(
                q,
                keys[self._packed_keys],
                values[self._packed_keys],
                self._cu_q,
                self._max_q,
                causal=True,
                scale=q.shape[-1] ** -0.5,
                backend=self.prefill_backend,
                cu_seqlens_k=self._cu_k,
                max_seqlen_k=self._max_k,
            )
        out, start = [], 0
        for seg, slots in zip(self.segments, self._keys, strict=True):
            qs = q[start : start + seg.num_new].transpose(0, 1)
            start += seg.num_new
            out.append(causal_attention(qs, keys[slots].transpose(0, 1), values[slots].transpose(0, 1)).transpose(0, 1))
        return torch.cat(out)

    def kv_slots(self, layer: int, num_new: int):
        """A pure decode step's store (see ``DecodeKV``); None for prompt chunks."""
        return self.decode.kv_slots(layer, num_new) if self.is_decode else None

    def attend_stored(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.decode.attend_stored(layer, q)

    def advance(self, num_new: int) -> None:
        """After the decoder's last layer: every request's cache now holds its new tokens."""
        if num_new != self.num_tokens:
            raise ValueError(f"advance({num_new}) but the batch has {self.num_tokens} new tokens")
        for seg in self.segments:
            seg.table.num_cached += seg.num_new
