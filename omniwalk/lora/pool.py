"""A fixed set of device slots holding adapters' weights, filled from host copies, least recently used first.

Every targeted projection has one A tensor ``[slots, max_rank, in]`` and one B tensor ``[slots, out,
max_rank]``, allocated once (CUDA graphs read them by address): loading an adapter into a slot copies its
weights in place and zeroes the rest of the slot (ranks below ``max_rank``, projections it does not
adapt), so every slot computes exactly its adapter's delta with the padded rank.

Projections that share an input and whose outputs a model computes as one merged GEMM (q/k/v, gate/up)
may be held merged (``merged``): one A ``[slots, n * max_rank, in]`` (the members' A stacked) and one
block-diagonal B ``[slots, sum of outs, n * max_rank]``, keyed (layer, merged name), so one ``add_lora``
on the merged output adds every member's delta (the zero blocks add exact zeros) in one launch pair.

A request holds its adapter's slot from ``acquire`` to ``release`` (a reference count). A slot whose
adapter no request holds is idle: it keeps its weights (the next request for that adapter loads
nothing) until a request for another adapter needs a slot and it is the least recently used idle one.
When every slot is held, ``acquire`` answers None and the caller waits for a release.

Unregistering an adapter that requests hold lets them finish: the name is gone at once (new requests
for it are refused, the name may be registered anew only after they finish), its slot and host copy
are freed at the last release.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from omniwalk.lora.adapters import Adapter, AdapterError, Target

# the merged projections of the thinker's decoder: name -> members, in the merged output's order
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass
class PoolStats:
    """Counters for /metrics."""

    loads: int = 0  # adapters copied host -> slot
    evictions: int = 0  # idle adapters dropped from their slot to load another (each one a swap)
    hits: int = 0  # acquires that found the adapter already in a slot
    waits: int = 0  # acquires answered None: every slot held

    @property
    def swaps(self) -> int:
        return self.evictions


class AdapterPool:
    """``slots`` device slots of adapters' weights, swapped in LRU from registered host ``Adapter`` s."""

    def __init__(
        self,
        targets: Mapping[tuple[int, str], Target],
        slots: int,
        max_rank: int,
        device,
        dtype: torch.dtype,
        merged: Mapping[str, tuple[str, ...]] | None = None,
    ):
        if slots < 1 or max_rank < 1:
            raise ValueError(f"an adapter pool needs slots >= 1 and max_rank >= 1, got {slots} and {max_rank}")
        self.targets, self.num_slots, self.max_rank = dict(targets), slots, max_rank
        self.device, self.dtype = torch.device(device), dtype
        # pool key -> its members: (module, first rank row, first output row)
        self.parts = _layout(self.targets, max_rank, merged or {})
        self.a: dict[tuple[int, str], torch.Tensor] = {}  # [slots, members * max_rank, in]
        self.b: dict[tuple[int, str], torch.Tensor] = {}  # [slots, members' outs, members * max_rank]
        for (layer, name), parts in self.parts.items():
            members = [self.targets[(layer, module)] for module, _, _ in parts]
            rank, n_out = len(members) * max_rank, sum(t.out_features for t in members)
            self.a[(layer, name)] = torch.zeros(slots, rank, members[0].in_features, device=device, dtype=dtype)
            self.b[(layer, name)] = torch.zeros(slots, n_out, rank, device=device, dtype=dtype)
        self.stats = PoolStats()
        self._host: dict[str, Adapter] = {}  # registered adapters, and unregistered ones still held
        self._unregistered: set[str] = set()
        self._refs: dict[str, int] = {}
        self._slot_of: dict[str, int] = {}
        self._owner: list[str | None] = [None] * slots
        self._idle: OrderedDict[int, None] = OrderedDict((s, None) for s in range(slots))  # least recent first
        self._lock = threading.Lock()

    def register(self, adapter: Adapter) -> None:
        """Keep ``adapter``'s weights on the host (pinned where the slots are on a GPU) under its new name."""
        if adapter.rank > self.max_rank:
            raise AdapterError(f"adapter {adapter.name!r} has rank {adapter.rank}, above the maximum {self.max_rank}")
        unknown = sorted(set(adapter.weights) - set(self.targets))
        if unknown:
            raise AdapterError(f"adapter {adapter.name!r} targets {unknown[0]}, which the pool does not hold")
        if self.device.type == "cuda":
            weights = {k: (a.pin_memory(), b.pin_memory()) for k, (a, b) in adapter.weights.items()}
            adapter = Adapter(name=adapter.name, path=adapter.path, rank=adapter.rank, weights=weights)
        with self._lock:
            if adapter.name in self._host:
                held = " (unloaded, but requests still use it)" if adapter.name in self._unregistered else ""
                raise AdapterError(f"adapter {adapter.name!r} is already loaded{held}", param="lora_name")
            self._host[adapter.name] = adapter
            self._refs[adapter.name] = 0

    def unregister(self, name: str) -> None:
        """Forget ``name``; requests holding it finish first (its slot and weights go at the last release)."""
        with self._lock:
            if name not in self._host or name in self._unregistered:
                raise AdapterError(f"adapter {name!r} is not loaded", param="lora_name")
            self._unregistered.add(name)
            if self._refs[name] == 0:
                self._forget(name)

    def names(self) -> list[str]:
        """The adapters new requests may name, in registration order."""
        return [name for name in self._host if name not in self._unregistered]

    def slot_of(self, name: str) -> int | None:
        """The slot ``name`` is in, or None."""
        return self._slot_of.get(name)

    def acquire(self, name: str) -> int | None:
        """Hold ``name``'s slot (loading it into a free or the least recently used idle slot); None when
        every slot is held by other adapters' requests."""
        with self._lock:
            if name not in self._host or name in self._unregistered:
                raise AdapterError(f"adapter {name!r} is not loaded", param="model")
            slot = self._slot_of.get(name)
            if slot is not None:
                self.stats.hits += 1
            elif not self._idle:
                self.stats.waits += 1
                return None
            else:
                slot = next(iter(self._idle))
                self._load(name, slot)
            self._refs[name] += 1
            self._idle.pop(slot, None)
            return slot

    def release(self, name: str) -> None:
        """Drop one hold of ``name``; at the last one its slot becomes idle (the most recently used)."""
        with self._lock:
            if self._refs.get(name, 0) < 1:
                raise ValueError(f"adapter {name!r} released more often than acquired")
            self._refs[name] -= 1
            if self._refs[name] == 0:
                self._idle[self._slot_of[name]] = None
                if name in self._unregistered:
                    self._forget(name)

    def _load(self, name: str, slot: int) -> None:
        evicted = self._owner[slot]
        if evicted is not None:
            del self._slot_of[evicted]
            self.stats.evictions += 1
        weights = self._host[name].weights
        for (layer, key), parts in self.parts.items():
            a, b = self.a[(layer, key)][slot], self.b[(layer, key)][slot]
            a.zero_()
            b.zero_()
            for module, rank0, out0 in parts:
                if (layer, module) in weights:
                    wa, wb = weights[(layer, module)]
                    r, n_out = wa.shape[0], wb.shape[0]
                    a[rank0 : rank0 + r].copy_(wa, non_blocking=True)
                    b[out0 : out0 + n_out, rank0 : rank0 + r].copy_(wb, non_blocking=True)
        self._owner[slot], self._slot_of[name] = name, slot
        self.stats.loads += 1

    def _forget(self, name: str) -> None:
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._owner[slot] = None
            self._idle.move_to_end(slot, last=False)  # a free slot is taken before any idle adapter's
        del self._host[name], self._refs[name]
        self._unregistered.discard(name)


def _layout(
    targets: Mapping[tuple[int, str], Target], max_rank: int, merged: Mapping[str, tuple[str, ...]]
) -> dict[tuple[int, str], list[tuple[str, int, int]]]:
    """Pool key -> [(member module, its first rank row, its first output row)]: a merged group where every
    member is a target of the layer, each other target alone."""
    parts: dict[tuple[int, str], list[tuple[str, int, int]]] = {}
    taken: set[tuple[int, str]] = set()
    for layer in sorted({layer for layer, _ in targets}):
        for name, members in merged.items():
            found = [targets.get((layer, m)) for m in members]
            if None not in found and len({t.in_features for t in found}) == 1:
                outs = [0]
                for m in members:
                    outs.append(outs[-1] + targets[(layer, m)].out_features)
                parts[(layer, name)] = [(m, i * max_rank, outs[i]) for i, m in enumerate(members)]
                taken.update((layer, m) for m in members)
    for key in targets:
        if key not in taken:
            parts[key] = [(key[1], 0, 0)]
    return parts
