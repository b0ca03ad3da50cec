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
"""

from __future__ import annotations

import bisect
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
    def __init__(self, name: str, fn: Callable[..., dict], inputs: dict[str, StaticInput], buckets: list[int], device):
        self.name, self.fn, self.inputs, self.buckets, self.device = name, fn, inputs, sorted(buckets), device
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict, dict]] = {}
        self.num_replays = 0

    @property
    def max_batch(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    def fits(self, n: int) -> bool:
        return 0 < n <= self.max_batch

    @torch.inference_mode()
    def capture(self, pool=None):
        """Record every bucket's graph; prints progress. Returns the memory pool (to share)."""
        start = time.perf_counter()
        for i, b in enumerate(reversed(self.buckets)):
            try:
                pool = self._capture(b, pool)
            except torch.cuda.OutOfMemoryError as e:
                raise MemoryError(
                    f"out of GPU memory capturing the {self.name} graph for batch {b}: lower "
                    "cuda_graph_max_batch (0 = no graphs) or the KV budgets (thinker_kv_bytes, talker_kv_bytes)"
                ) from e
            print(
                f"cuda graphs: {self.name} batch {b} ({i + 1}/{len(self.buckets)}, {time.perf_counter() - start:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        torch.cuda.synchronize(self.device)
        return pool

    def _capture(self, b: int, pool):
        static = {
            k: torch.full((b, *spec.shape), spec.pad, dtype=spec.dtype, device=self.device)
            for k, spec in self.inputs.items()
        }
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm up (lazy kernel compilation, allocator) off the graph
            for _ in range(2):
                self.fn(**static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self.fn(**static)
        self.graphs[b] = (graph, static, out)
        return graph.pool()

    def run(self, n: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]
        graph, static, out = self.graphs[bucket]
        fill_static(static, self.inputs, inputs, n)
        graph.replay()
        self.num_replays += 1
        return {k: v[:n] for k, v in out.items()}
