"""CUDA graphs of a fixed-shape step function, one graph per batch-size bucket.

A ``GraphedStep`` wraps ``fn(**inputs) -> dict of tensors`` whose inputs and outputs all have
the batch as their first dimension and touch no host data. ``capture`` records one graph per
bucket (largest first, all in one memory pool) over static input buffers. ``run(n, inputs)``
copies the live rows into the smallest bucket that holds ``n`` (an input may be narrower than
its buffer in later dimensions; an input not given is all ``pad``), sets the padding rows to each
input's ``pad`` value, replays,
and returns the outputs' first ``n`` rows: views of static buffers, valid until the next replay.
Inputs may live on the host (numpy arrays, CPU tensors): the step's small ones (at most
``SMALL_ROW_BYTES`` a row: ids, positions, slots, lengths) lie back to back in one buffer per
bucket and go up in one pinned copy, padding rows included, instead of a copy (and a second one
into the static buffer) each; a larger host input is copied up on its own.

Padding rows must be harmless by construction: the model programs pad KV slots with a scratch
slot and key lengths with 0, so padding rows write nowhere that matters and read nothing.

A ``KeyedGraphs`` is the same for steps whose static shapes depend on more than a batch size
(e.g. the encoders' (tokens, segments) buckets): one graph per key, inputs padded by the caller.
"""

from __future__ import annotations

import bisect
import functools
import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

SMALL_ROW_BYTES = 64  # a static input of at most this many bytes a row goes up in the packed copy
_ALIGN = 16  # bytes: each packed input's offset in its bucket's buffer


@dataclass(frozen=True)
class StaticInput:
    shape: tuple[int, ...]  # per row (without the batch dimension)
    dtype: torch.dtype
    pad: int | float = 0  # value of padding rows


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to ``max_batch`` (itself included)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes)) if max_batch > 0 else []


def record_graph(fn: Callable[..., dict], static: dict, pool, device) -> tuple[torch.cuda.CUDAGraph, dict]:
    """Warm ``fn(**static)`` up once off the graph (Triton's compiles, lazily made tables and
    buffers), then record it into ``pool``: (graph, its outputs). (A second warm-up would add a third
    of every capture's time to the start-up and nothing it needs.)"""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn(**static)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # No Python garbage collection inside the capture: a collected cycle holding another CUDA graph
    # (e.g. an earlier model's, in the same process) would destroy it mid-capture, which CUDA refuses
    # ("operation not permitted when stream is capturing") and the capture is lost. torch.cuda.graph
    # collects once before it starts capturing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = fn(**static)
    finally:
        if collecting:
            gc.enable()
    return graph, out


def rows_in_graph(graph: GraphedStep | None, rows: list[bool]) -> list[bool]:
    """A program's ``graph_rows``: the rows its captured step can run (``rows``; more than its
    largest bucket run as several batches), or none when there is no graph."""
    return rows if graph is not None else [False] * len(rows)


def even_pieces(items: list, limit: int) -> list[list]:
    """``items`` in the fewest pieces of at most ``limit`` (0: no limit), their sizes within one of
    each other (80 rows under a limit of 64: two of 40, each a bucket of its own, rather than 64 + 16)."""
    n = len(items)
    k = -(-n // (limit or n or 1))
    return [items[i * n // k : (i + 1) * n // k] for i in range(k)]


def graph_batch(graph: GraphedStep | None) -> int:
    """A program's ``graph_batch``: its graph's largest bucket (0: no graph)."""
    return graph.max_batch if graph is not None else 0


def _is_host(x) -> bool:
    return isinstance(x, np.ndarray) or (isinstance(x, torch.Tensor) and x.device.type == "cpu")


def fill_static(static: dict, specs: dict[str, StaticInput], inputs: dict, n: int) -> None:
    """Copy ``n`` live rows into the static buffers (inputs may be narrower in later dimensions;
    host ones are copied up first, pinned) and set the rows after them to each input's pad value;
    an input missing from ``inputs`` (or None) is its pad value in every row."""
    for name, spec in specs.items():
        buf, x = static[name], inputs.get(name)
        if x is None:
            buf.fill_(spec.pad)
            continue
        rows = buf[(slice(0, n), *(slice(0, s) for s in x.shape[1:]))]
        if _is_host(x):  # pinned, then straight into the rows when they lie back to back
            x = torch.as_tensor(x).pin_memory() if buf.is_cuda else torch.as_tensor(x)
            x = x if rows.is_contiguous() else x.to(buf.device, non_blocking=True)
            rows.copy_(x, non_blocking=True)
        else:
            rows.copy_(x)
        if buf.shape[0] > n:
            buf[n:].fill_(spec.pad)


class PackedInputs:
    """The small static inputs of one bucket (``b`` rows) as views of one device buffer, and their
    upload from the host in one pinned copy."""

    def __init__(self, specs: dict[str, StaticInput], b: int, device):
        self.specs, self.b, self.offsets, size = specs, b, {}, 0
        for name, spec in specs.items():
            self.offsets[name] = size
            size += -(-b * _row_bytes(spec) // _ALIGN) * _ALIGN
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device)
        self.views = {name: self._view(self.buffer, name) for name in specs}
        for name, spec in specs.items():
            self.views[name].fill_(spec.pad)

    def _view(self, buffer, name: str):
        spec, start = self.specs[name], self.offsets[name]
        rows = buffer[start : start + self.b * _row_bytes(spec)]
        if isinstance(rows, np.ndarray):
            return rows.view(_numpy_dtype(spec.dtype)).reshape(self.b, *spec.shape)
        return rows.view(spec.dtype).view(self.b, *spec.shape)

    def upload(self, inputs: dict, n: int) -> None:
        """Host inputs' ``n`` rows (narrower ones in their leading columns), every other row and
        input its pad value (a device input is copied over it after this)."""
        staging = torch.empty(self.buffer.shape[0], dtype=torch.uint8, pin_memory=self.buffer.is_cuda)
        host = staging.numpy()
        for name, spec in self.specs.items():
            view, x = self._view(host, name), inputs.get(name)
            view[...] = spec.pad
            if x is not None and _is_host(x):
                x = x.numpy() if isinstance(x, torch.Tensor) else x
                view[(slice(0, n), *(slice(0, s) for s in x.shape[1:]))] = x
        self.buffer.copy_(staging, non_blocking=True)


def _row_bytes(spec: StaticInput) -> int:
    return math.prod(spec.shape) * torch.empty(0, dtype=spec.dtype).element_size()


def _numpy_dtype(dtype: torch.dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype


def _packable(spec: StaticInput) -> bool:
    return _row_bytes(spec) <= SMALL_ROW_BYTES and _dtype_on_host(spec.dtype)


def _dtype_on_host(dtype: torch.dtype) -> bool:
    try:
        _numpy_dtype(dtype)
    except TypeError:  # (bfloat16: numpy has none)
        return False
    return True


class GraphedStep:
    """``fn``'s graphs per batch bucket (a ``KeyedGraphs`` keyed by batch size, inputs all pad)."""

    def __init__(self, name: str, fn: Callable[..., dict], inputs: dict[str, StaticInput], buckets: list[int], device):
        self.name, self.fn, self.inputs, self.buckets, self.device = name, fn, inputs, sorted(buckets), device
        self.small = {k: s for k, s in inputs.items() if _packable(s)}
        self.packed: dict[int, PackedInputs] = {}  # bucket -> its small inputs' buffer
        knob = "cuda_graph_max_batch (0 = no graphs) or the stages' KV budgets (the *_kv_bytes options)"
        self.keyed = KeyedGraphs(f"{name} batch", lambda b, **kw: fn(**kw), self._pads, self.buckets, device, knob)

    def _pads(self, b: int) -> dict[str, torch.Tensor]:
        self.packed[b] = PackedInputs(self.small, b, self.device)
        large = {k: s for k, s in self.inputs.items() if k not in self.small}
        return {
            **self.packed[b].views,
            **{k: torch.full((b, *s.shape), s.pad, dtype=s.dtype, device=self.device) for k, s in large.items()},
        }

    @property
    def max_batch(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    @property
    def num_replays(self) -> int:
        return self.keyed.num_replays

    def fits(self, n: int) -> bool:
        return 0 < n <= self.max_batch

    def capture(self, pool=None):
        """Record every bucket's graph (largest first); prints progress. Returns the memory pool."""
        return self.keyed.capture(pool)

    def run(self, n: int, inputs: dict, patch: Callable[[dict], None] | None = None) -> dict[str, torch.Tensor]:
        """Replay for ``n`` rows of ``inputs`` (device tensors, or host arrays: see the module
        docstring); ``patch(static inputs)`` may then overwrite rows on the device (e.g. ids
        still in flight) before the replay."""
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        static = self.keyed.graphs[bucket][1]
        specs = self.inputs
        if any(_is_host(inputs.get(k)) for k in self.small):  # one upload for every small input
            self.packed[bucket].upload(inputs, n)
            specs = {k: s for k, s in specs.items() if k not in self.small or _on_device(inputs.get(k))}
        fill_static(static, specs, inputs, n)
        if patch is not None:
            patch(static)
        return {k: v[:n] for k, v in self.replay(bucket).items()}

    def replay(self, bucket: int) -> dict[str, torch.Tensor]:
        """The bucket's graph over what its static inputs hold now."""
        return self.keyed.replay(bucket)


def _on_device(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type != "cpu"


class KeyedGraphs:
    """One CUDA graph of ``fn(key, **inputs) -> dict of tensors`` per key, largest key first, all in
    one memory pool. ``make_inputs(key)`` gives a key's static input buffers, holding values that
    are valid to run on (they are the capture's warm-up inputs); ``run(key, inputs)`` copies tensors
    of exactly those shapes into them, replays, and returns the outputs: static buffers, valid
    until the next replay of that key. ``str(key)`` names it in the progress output."""

    def __init__(self, name: str, fn: Callable[..., dict], make_inputs: Callable, keys: list, device, knob: str):
        self.name, self.fn, self.make_inputs, self.device, self.knob = name, fn, make_inputs, device, knob
        self.keys = sorted(keys, reverse=True)
        self.graphs: dict = {}  # key -> (graph, static inputs, outputs)
        self.num_replays = 0

    @torch.inference_mode()
    def capture(self, pool=None):
        """Record every key's graph; prints progress. Returns the memory pool (to share)."""
        start = time.perf_counter()
        for i, key in enumerate(self.keys):
            static = self.make_inputs(key)
            try:
                graph, out = record_graph(functools.partial(self.fn, key), static, pool, self.device)
            except torch.cuda.OutOfMemoryError as e:
                raise MemoryError(
                    f"out of GPU memory capturing the {self.name} graph for {key}: lower {self.knob}"
                ) from e
            self.graphs[key] = (graph, static, out)
            pool = graph.pool()
            print(
                f"cuda graphs: {self.name} {key} ({i + 1}/{len(self.keys)}, {time.perf_counter() - start:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        torch.cuda.synchronize(self.device)
        return pool

    def run(self, key, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for name, buf in self.graphs[key][1].items():
            buf.copy_(inputs[name])
        return self.replay(key)

    def replay(self, key) -> dict[str, torch.Tensor]:
        """Replay over what the key's static inputs hold now; returns its outputs."""
        graph, _, out = self.graphs[key]
        graph.replay()
        self.num_replays += 1
        return out
