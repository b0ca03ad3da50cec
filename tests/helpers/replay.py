"""Stand-ins for CUDA-graph capture that run the recorded step eagerly, so the graph paths run on the CPU."""

from __future__ import annotations

import torch

from omniwalk.engine.cuda_graphs import GraphedStep


class EagerReplay:
    """A CPU stand-in for ``KeyedGraphs``: static inputs per key; a replay runs the function on them."""

    def __init__(self, name, fn, make_inputs, keys, device, knob):
        self.fn, self.graphs, self.num_replays = fn, {key: (None, make_inputs(key), None) for key in keys}, 0

    def capture(self, pool=None):
        return pool

    def run(self, key, inputs):
        for name, buf in self.graphs[key][1].items():
            buf.copy_(inputs[name])
        return self.replay(key)

    def replay(self, key):
        self.num_replays += 1
        return self.fn(key, **self.graphs[key][1])


class ReplayOnCPU(GraphedStep):
    """``GraphedStep`` without CUDA: its own static buffers per batch bucket and input staging (the
    packed upload of small host inputs, ``fill_static``, patches), ``fn`` run over the whole buffers
    in place of a replay, outputs sliced; the same buffers every call."""

    def capture(self, pool=None):
        self.keyed.graphs = {b: (None, self._pads(b), None) for b in self.buckets}
        return pool

    def replay(self, bucket: int) -> dict[str, torch.Tensor]:
        self.keyed.num_replays += 1
        return self.fn(**self.keyed.graphs[bucket][1])
