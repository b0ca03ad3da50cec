"""CUDA graphs of a fixed-shape step function, one graph per batch-size bucket.

A ``GraphedStep`` wraps ``fn(**inputs) -> dict of tensors`` whose inputs and outputs all have
the batch as their first dimension and touch no host data. ``capture`` records one graph per
bucket (largest first, all in one memory pool) over static input buffers. ``run(n, inputs)``
copies the live rows into the smallest bucket that holds ``n`` (an input may be narrower than
its buffer in later dimensions; an input not given is all ``pad``), sets the padding rows to each
input's ``pad`` value, replays,
and returns the outputs' first ``n`` rows: views of static buffers, valid until the next replay.

Padding rows must be harmless by construction: the model programs pad KV slots with a scratch
slot and key lengths with 0, so padding rows write nowhere that matters and read nothing.

A ``KeyedGraphs`` is the same for steps whose static shapes depend on more than a batch size
(e.g. the encoders' (tokens, segments) buckets): one graph per key, inputs padded by the caller.
"""

from __future__ import annotations

import bisect
import functools
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


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
    buffers), then record it into ``pool``: (graph, its outputs). (A second warm-up, as before
    session 26, added a third of every capture's time to the start-up and nothing it needs.)"""
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
    """A program's ``graph_rows``: the rows its captured step can run (``rows``), or none when
    there is no graph or too many rows for its largest bucket."""
    return rows if graph is not None and graph.fits(sum(rows)) else [False] * len(rows)


def fill_static(static: dict, specs: dict[str, StaticInput], inputs: dict[str, torch.Tensor], n: int) -> None:
    """Copy ``n`` live rows into the static buffers (inputs may be narrower in later dimensions)
    and set the rows after them to each input's pad value; an input missing from ``inputs`` (or
    None) is its pad value in every row."""
    for name, spec in specs.items():
        buf, x = static[name], inputs.get(name)
        if x is None:
            buf.fill_(spec.pad)
            continue
        buf[(slice(0, n), *(slice(0, s) for s in x.shape[1:]))].copy_(x)
        if buf.shape[0] > n:
            buf[n:].fill_(spec.pad)


class GraphedStep:
    """``fn``'s graphs per batch bucket (a ``KeyedGraphs`` keyed by batch size, inputs all pad)."""

    def __init__(self, name: str, fn: Callable[..., dict], inputs: dict[str, StaticInput], buckets: list[int], device):
        self.name, self.inputs, self.buckets, self.device = name, inputs, sorted(buckets), device
        knob = "cuda_graph_max_batch (0 = no graphs) or the stages' KV budgets (the *_kv_bytes options)"
        self.keyed = KeyedGraphs(f"{name} batch", lambda b, **kw: fn(**kw), self._pads, self.buckets, device, knob)

    def _pads(self, b: int) -> dict[str, torch.Tensor]:
        return {k: torch.full((b, *s.shape), s.pad, dtype=s.dtype, device=self.device) for k, s in self.inputs.items()}

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

    def run(self, n: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        fill_static(self.keyed.graphs[bucket][1], self.inputs, inputs, n)
        return {k: v[:n] for k, v in self.keyed.replay(bucket).items()}


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
