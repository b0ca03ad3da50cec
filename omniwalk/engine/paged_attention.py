"""Attention over paged KV for one engine step of many requests (packed along the token axis).

A ``PagedBatch`` is built once per step from the requests' page tables and how many new tokens
each contributes; it is the decoder's ``KVCache`` for that step. Every decoder layer calls
``attend``: the new keys/values are written into their slots, then each request's queries attend
causally to all of its keys (reference path: per request, gathered, the same function the
contiguous cache uses). The decoder calls ``advance`` after its last layer.

Slot indices are built on the host from the page tables (plain Python, no device reads) and
copied to the device once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniwalk.device import to_device
from omniwalk.engine.kv_pages import KVStorage, PageTable
from omniwalk.layers.kv_attention import causal_attention


@dataclass
class Segment:
    table: PageTable
    num_new: int


class PagedBatch:
    """The decoder's KV context for one step (implements ``attend``/``advance``)."""

    def __init__(self, storage: KVStorage, segments: list[Segment], device):
        self.storage, self.segments = storage, segments
        pool = storage.pool
        new_slots, self._keys = [], []
        for seg in segments:
            start = seg.table.num_cached
            slots = seg.table.slots(pool, 0, start + seg.num_new)
            new_slots.extend(slots[start:])
            self._keys.append(to_device(slots, device, torch.long))
        self._new_slots = to_device(new_slots, device, torch.long)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.segments)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [n, heads, d], k/v [n, kv_heads, d] packed in segment order -> out [n, heads, d]."""
        keys, values = self.storage.keys[layer], self.storage.values[layer]
        keys.index_copy_(0, self._new_slots, k.to(keys.dtype))
        values.index_copy_(0, self._new_slots, v.to(values.dtype))
        out, start = [], 0
        for seg, slots in zip(self.segments, self._keys, strict=True):
            qs = q[start : start + seg.num_new].transpose(0, 1)
            start += seg.num_new
            out.append(causal_attention(qs, keys[slots].transpose(0, 1), values[slots].transpose(0, 1)).transpose(0, 1))
        return torch.cat(out)

    def advance(self, num_new: int) -> None:
        """After the decoder's last layer: every request's cache now holds its new tokens."""
        if num_new != self.num_tokens:
            raise ValueError(f"advance({num_new}) but the batch has {self.num_tokens} new tokens")
        for seg in self.segments:
            seg.table.num_cached += seg.num_new
