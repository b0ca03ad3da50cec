"""The thinker's LoRA adapters in one engine: loaded by name, their weights in a fixed pool of device slots.

A request names an adapter (``lora``) or none (the base model). It uses the adapter from joining the
thinker stage (``join``) to leaving it (``leave``: finished, aborted or failed), and holds the adapter's
slot from before its first forward (``holds_slot``: while every slot is held by other adapters' requests it
waits, never fails) to leaving; a preempted request keeps its slot. Each forward gets its rows' slots
(-1: base) as ``LoraRows``. Unloading an adapter stops new requests at once; the requests using it
finish with it, and its weights go when the last one leaves.

Every load gets a new ``key`` (its name and a load number): the request's prefix pages are keyed by it,
so two adapters never share KV, nor an adapter and a later one loaded under the same name.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import torch

from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.layers.decoder import DecoderConfig
from omniwalk.layers.linear import LoraRows
from omniwalk.lora.adapters import AdapterError, load_adapter, thinker_targets
from omniwalk.lora.pool import MERGED, AdapterPool

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")  # what a ``model`` field can carry


class ThinkerAdapters:
    """``merged``: the thinker runs merged q/k/v and gate/up projections (the fused decoder kernels), so the
    pool holds their adapters merged too: one ``add_lora`` on each merged output (``lora/pool.py``)."""

    def __init__(
        self, cfg: DecoderConfig, slots: int, max_rank: int, device, dtype: torch.dtype, backend: str, merged: bool
    ):
        self.targets = thinker_targets(cfg)
        self.pool = AdapterPool(self.targets, slots, max_rank, device, dtype, merged=MERGED if merged else None)
        self.max_rank, self.dtype, self.backend = max_rank, dtype, backend
        self.keys: dict[str, str] = {}  # name -> the key of its current load
        self.users: dict[str, int] = {}  # name -> requests in the thinker stage using it
        self.unloading: set[str] = set()  # unloaded names whose requests have not all left
        self._loads = itertools.count()

    def load(self, name: str, path: str) -> None:
        """Read the PEFT adapter at ``path`` and serve it as ``name`` (``AdapterError`` naming the problem)."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise AdapterError(f"adapter name {name!r}: letters, digits and . _ : / - (at most 128)", "lora_name")
        if name in self.keys or name in self.unloading:
            held = " (unloaded, but requests still use it)" if name in self.unloading else ""
            raise AdapterError(f"adapter {name!r} is already loaded{held}", "lora_name")
        self.pool.register(load_adapter(name, path, self.targets, max_rank=self.max_rank, dtype=self.dtype))
        self.keys[name] = f"{name}#{next(self._loads)}"

    def unload(self, name: str) -> None:
        """Stop serving ``name``; requests already using it finish with it."""
        if name not in self.keys:
            raise AdapterError(f"adapter {name!r} is not loaded", "lora_name")
        del self.keys[name]
        if self.users.get(name, 0):
            self.unloading.add(name)
        else:
            self.pool.unregister(name)

    def names(self) -> list[str]:
        return list(self.keys)

    def key_of(self, name: str) -> str:
        """The key of ``name``'s current load, for a new request (``InvalidRequestError`` if not loaded)."""
        if name not in self.keys:
            served = ", ".join(self.names()) or "none"
            raise InvalidRequestError(f"unknown adapter {name!r} (loaded: {served})", "lora")
        return self.keys[name]

    def join(self, st) -> None:
        """A request (its ``ThinkerState``) naming ``st.lora`` joined the thinker stage."""
        self.users[st.lora] = self.users.get(st.lora, 0) + 1

    def holds_slot(self, req) -> bool:
        """Whether ``req``'s adapter is in a slot it holds (taken now if one is free or idle); False while
        every slot is held by other adapters' requests (it waits)."""
        st = req.state.thinker
        if st.lora_slot >= 0:
            return True
        try:
            slot = self.pool.acquire(st.lora)
        except AdapterError as e:  # (not expected: an adapter in use stays loaded until its requests leave)
            req.fail(e)
            return False
        st.lora_slot = -1 if slot is None else slot
        return slot is not None

    def leave(self, st) -> None:
        """The request left the stage: its slot goes back; an unloaded adapter's last user frees it."""
        if st.lora_slot >= 0:
            self.pool.release(st.lora)
            st.lora_slot = -1
        self.users[st.lora] -= 1
        if not self.users[st.lora] and st.lora in self.unloading:
            self.unloading.discard(st.lora)
            self.pool.unregister(st.lora)

    def rows(self, slots: torch.Tensor) -> LoraRows:
        """A forward's adapters from its rows' slots ([n] int32 on the device; -1: base)."""
        return LoraRows(slots, self.pool.a, self.pool.b, self.backend)

    def stats(self) -> dict:
        s = self.pool.stats
        return {"lora_loads": s.loads, "lora_swaps": s.swaps, "lora_waits": s.waits, "lora_adapters": len(self.keys)}


def row_slots(batch) -> np.ndarray | None:
    """Each packed row's adapter slot for a step's chunks (a chunk's n rows: its request's), or None when
    every row is the base model's."""
    slots = [req.state.thinker.lora_slot for req, _, _ in batch]
    if max(slots) < 0:
        return None
    return np.repeat(np.asarray(slots, dtype=np.int32), [n for _, _, n in batch])


def name_adapter(st, adapters: ThinkerAdapters | None, request: dict) -> None:
    """A request's ``lora`` (an adapter's name; None or absent: the base model) -> its ``ThinkerState``'s."""
    name = request.get("lora")
    if name is None:
        return
    if not isinstance(name, str):
        raise InvalidRequestError(f"lora must be an adapter's name, got {type(name).__name__}", "lora")
    if adapters is None:
        raise InvalidRequestError(f"unknown adapter {name!r}: this engine serves none (max_loras is 0)", "lora")
    st.lora, st.lora_key = name, adapters.key_of(name)


def thinker_adapters(cfg: DecoderConfig, config, device) -> ThinkerAdapters | None:
    """The engine's adapters for a resolved ``OmniConfig`` (None with ``max_loras`` 0), those of
    ``engine.loras`` loaded. Tensor-parallel thinkers are refused (their projections are split)."""
    engine, model = config.engine, config.model
    if not engine.max_loras:
        return None
    if model.tensor_parallel > 1:
        raise ConfigError("LoRA adapters (max_loras > 0) with tensor_parallel > 1 are not supported yet")
    merged = model.decoder_kernels == "fused"  # (``layers/decoder.py``: q/k/v and gate/up merged)
    adapters = ThinkerAdapters(
        cfg, engine.max_loras, engine.max_lora_rank, device, model.torch_dtype, model.lora_backend, merged
    )
    for spec in engine.loras:
        name, _, path = spec.partition("=")
        adapters.load(name, path)
    return adapters
