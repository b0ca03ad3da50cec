"""Timing and counting inside engine steps, for the micro-benchmarks (``micro.py``) and ``profile_walk.py``.

``StageClock`` times each stage's ``step()`` + ``finish()`` synchronised; ``stage_kernels`` lists the
GPU kernels one stage step launches (torch profiler, CUDA only); ``count_kernels`` counts a call's
kernels; ``routed_experts`` counts the distinct experts a decoder's MoE layers route to (in a step
run eagerly: ``eager_decode``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from harness import synchronize
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from omniwalk.layers.moe import SparseMoE

KERNEL_TOP = 25  # kernels listed per stage step, by total time
# a program's CUDA graphs: the thinker's and the talker's decode steps, the thinker's prefill layers, a
# DecoderPrefill's (the talker's prefill layers)
GRAPH_ATTRIBUTES = ("decode_graph", "frame_graph", "prefill_graphs", "graphs")


class StageClock:
    """Inside ``with``: every engine stage's ``step()`` + ``finish()`` (its launch, then its read
    and commit) is timed (synchronised, ms) per engine step."""

    def __init__(self, engine, device):
        self.engine, self.device = engine, device
        self.ms: dict[str, list[float]] = {name: [] for name in engine.stages}

    def __enter__(self) -> StageClock:
        for name, stage in self.engine.stages.items():
            # instance attributes shadow the methods
            stage.step, stage.finish = self._timed(name, stage.step, False), self._timed(name, stage.finish, True)
        return self

    def __exit__(self, *exc) -> None:
        for stage in self.engine.stages.values():
            del stage.step, stage.finish

    def _timed(self, name: str, method, adds: bool):
        def run():
            synchronize(self.device)
            start = time.perf_counter()
            result = method()
            synchronize(self.device)
            ms = (time.perf_counter() - start) * 1e3
            if adds:  # finish(): part of the same engine step as the step() before it
                self.ms[name][-1] += ms
            else:
                self.ms[name].append(ms)
            return result

        return run


def _is_kernel(event) -> bool:
    # (the profiler also puts record_function ranges on the GPU timeline: "micro:stage" is one)
    return event.device_type == DeviceType.CUDA and not event.name.startswith(("Memcpy", "Memset", "micro:"))


def count_kernels(fn, device) -> int | None:
    """GPU kernels ``fn()`` runs (a graph replay's kernels each count), None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for e in prof.events() if _is_kernel(e))


def stage_kernels(engine, stage_name: str, device) -> dict | None:
    """GPU kernels of ``stage_name`` in one engine step: those starting inside its step() or
    finish(), each synchronised on both sides by the StageClock -> {count, busy_us (kernel time
    summed), span_us (first kernel start to last kernel end: the rest are gaps), top (the kernels
    by total time, grouped by name)}; None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    stage = engine.stages[stage_name]

    def ranged(method):
        def run():
            with record_function("micro:stage"):
                return method()

        return run

    with StageClock(engine, device):
        stage.step, stage.finish = ranged(stage.step), ranged(stage.finish)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step()
    events = prof.events()
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "micro:stage"]
    kernels = [e for e in events if _is_kernel(e) and any(a <= e.time_range.start <= b for a, b in spans)]
    if not kernels:
        return dict(count=0, busy_us=0.0, span_us=0.0, top=[])
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:KERNEL_TOP]
    return dict(
        count=len(kernels),
        busy_us=sum(e.time_range.end - e.time_range.start for e in kernels),
        span_us=max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels),
        top=[dict(name=n, calls=len(t), total_us=round(sum(t), 1), mean_us=round(sum(t) / len(t), 2)) for n, t in top],
    )


def routed_experts(decoder, run) -> float | None:
    """Mean distinct experts per MoE layer over the eager forwards in ``run()`` (None if no MoE layer
    ran eagerly, e.g. a replayed CUDA graph: see ``eager_decode``). Each layer's choice is
    ``SparseMoE.select`` on its input, before the call advances a balanced draw: the experts it routes to."""
    counts = []

    def count(moe: SparseMoE, args) -> None:
        _, ids = moe.select(args[0])
        counts.append(ids.unique().numel())

    moes = [m for m in decoder.modules() if isinstance(m, SparseMoE)]
    handles = [moe.register_forward_pre_hook(count) for moe in moes]
    try:
        with torch.inference_mode():
            run()
    finally:
        for h in handles:
            h.remove()
    return sum(counts) / len(counts) if counts else None


@contextmanager
def eager_decode(program):
    """Inside: ``program``'s steps run eagerly (its decode and prefill graphs set aside), so hooks see its layers."""
    holders = [program, getattr(program, "layers", None)]  # (a talker's prefill graphs: its DecoderPrefill's)
    set_aside = [(h, n, getattr(h, n)) for h in holders for n in GRAPH_ATTRIBUTES if getattr(h, n, None) is not None]
    for holder, name, _ in set_aside:
        setattr(holder, name, None)
    try:
        yield
    finally:
        for holder, name, graph in set_aside:
            setattr(holder, name, graph)
