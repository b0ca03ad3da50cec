"""Stand-alone MoE layer timings on the GPU: the fused backend's two expert paths (GEMVs over
(token, expert) pairs, grouped GEMM over expert-sorted pairs) vs tokens per call, and GEMV block
variants; sets ``moe.MAX_GEMV_PAIRS`` and ``fused_moe.GEMV_BLOCKS`` by measurement.

    PYTHONPATH=. python benchmarks/fused_moe.py --out DIR

Each figure: one CUDA graph running the router GEMM, routing kernel and experts of ``--layers``
layers with their own random bf16 weights (more bytes than L2 holds), replayed; µs per layer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from omniwalk.layers.fused_moe import GEMV_BLOCKS, expert_gemv, route_topk
from omniwalk.layers.moe import grouped_experts

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (harness.py beside this file)
from harness import replay_us  # noqa: E402

SHAPES = {  # name: (hidden, experts incl. folded shared slices, routed experts, top_k + shared slots, width)
    "thinker": (2048, 128, 128, 8, 768),
    "talker": (1024, 130, 128, 8, 384),
}
VARIANTS = [GEMV_BLOCKS, (16, 256, 32, 128, 4), (8, 512, 16, 256, 4), (8, 512, 16, 256, 8), (16, 512, 16, 512, 8)]


def layer_weights(shape, layers: int):
    hidden, experts, routed, _, inter = shape
    out = []
    for _ in range(layers):
        out.append(
            (
                torch.randn(routed + (experts > routed), hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5,
                torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5,
                torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) * inter**-0.5,
            )
        )
    return out


def moe_layer(x, router, gate_up, down, top_k: int, shared: int, path: str, blocks):
    weights, ids = route_topk(F.linear(x, router), top_k, True, shared)
    if path == "gemv":
        return expert_gemv(x, gate_up, down, weights, ids, blocks)
    return grouped_experts(x, gate_up, down, weights, ids)


def time_us(fn, layers: int, replays: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return replay_us(graph, replays) / layers


def bench_shape(name: str, shape, layers: int, tokens: list[int]) -> list[dict]:
    weights, rows = layer_weights(shape, layers), []
    hidden, experts, routed, slots, _ = shape
    shared = experts - routed
    for n in tokens:
        x = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16)
        variants = [("grouped", None)] + [("gemv", b) for b in (VARIANTS if n in (1, 8, 32) else VARIANTS[:1])]
        for path, blocks in variants:

            def run(path=path, blocks=blocks):
                for w in weights:
                    moe_layer(x, *w, slots - shared, shared, path, blocks)

            us = time_us(run, layers)
            rows.append(dict(shape=name, tokens=n, pairs=n * slots, path=path, blocks=blocks, us_per_layer=us))
            print(f"{name:8s} tokens={n:3d} pairs={n * slots:4d} {path:8s} {blocks}: {us:7.1f} µs/layer", flush=True)
    return rows


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", default="1,2,4,8,16,32")
    args = p.parse_args()
    rows = []
    for name, shape in SHAPES.items():
        rows += bench_shape(name, shape, args.layers, [int(t) for t in args.tokens.split(",")])
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_moe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
