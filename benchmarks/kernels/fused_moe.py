"""Stand-alone MoE timings on the GPU: each decode kernel alone over its block variants (routing
with the router folded in vs the router GEMM + routing on its logits; gate_up; down), then whole
layers: before (router GEMM + routing, the previous GEMV blocks), now (the defaults), and the
grouped GEMM past ``layers/moe.MAX_GEMV_PAIRS``. What it measures sets the tuned configurations
``omniwalk/kernels/configs/moe_routing,device_name=<GPU>.json`` and ``fused_moe,device_name=<GPU>.json``.

    PYTHONPATH=. python benchmarks/kernels/fused_moe.py --out DIR

Each figure: one CUDA graph running the part for ``--layers`` layers with their own random bf16
weights (more bytes than L2 holds), replayed; µs per layer. Kernels alone get a fixed routing:
each token's top-k distinct random experts (and the shared slices).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from omniwalk.kernels.fused_moe import (
    DOWN_BLOCKS,
    GATE_UP_BLOCKS,
    expert_down,
    expert_gate_up,
    expert_gemv,
    grouped_experts,
)
from omniwalk.kernels.moe_routing import ROUTER_BLOCKS, route_folded, route_topk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (harness.py)
from harness import replay_us  # noqa: E402

SHAPES = {  # name: (hidden, experts incl. folded shared slices, routed experts, top_k + shared slots, width)
    "thinker": (2048, 128, 128, 8, 768),
    "talker": (1024, 130, 128, 8, 384),
}
BEFORE = (16, 256, 8)  # the previous GEMV blocks (both kernels)
ROUTER_VARIANTS = [ROUTER_BLOCKS, (2, 4), (8, 4), (16, 8)]
GATE_UP_VARIANTS = [GATE_UP_BLOCKS, BEFORE, (8, 2048, 8), (4, 1024, 4), (8, 1024, 8), (8, 512, 4), (2, 2048, 4)]
DOWN_VARIANTS = [DOWN_BLOCKS, BEFORE, (16, 1024, 8), (4, 1024, 4), (8, 512, 4), (32, 256, 8)]


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


def fixed_routes(shape, tokens: int, layers: int):
    """Per layer: ids [tokens, slots] int32 (distinct random experts, then the shared slices), weights."""
    _, experts, routed, slots, _ = shape
    shared = experts - routed
    out = []
    for _ in range(layers):
        ids = torch.stack([torch.randperm(routed, device="cuda")[: slots - shared] for _ in range(tokens)])
        ids = torch.cat([ids, torch.arange(routed, experts, device="cuda").expand(tokens, shared)], 1).int()
        out.append((ids, torch.rand(tokens, slots, device="cuda", dtype=torch.bfloat16)))
    return out


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


def kernels_alone(name: str, shape, weights, tokens: int, counters) -> list[dict]:
    hidden, experts, routed, slots, inter = shape
    shared, layers = experts - routed, len(weights)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    routes = fixed_routes(shape, tokens, layers)
    acts = [torch.randn(tokens * slots, inter, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    parts = [
        (
            "router GEMM + route_topk",
            None,
            lambda w, r, a, b: route_topk(F.linear(x, w[0]), slots - shared, True, shared),
        )
    ]
    parts += [
        ("route_folded", b, lambda w, r, a, b: route_folded(x, w[0], counters, slots - shared, True, shared, b))
        for b in ROUTER_VARIANTS
    ]
    parts += [("expert_gate_up", b, lambda w, r, a, b: expert_gate_up(x, w[1], r[0], b)) for b in GATE_UP_VARIANTS]
    parts += [("expert_down", b, lambda w, r, a, b: expert_down(a, w[2], r[1], r[0], b)) for b in DOWN_VARIANTS]
    rows = []
    for kernel, blocks, call in parts:
        us = time_us(lambda: [call(w, r, a, blocks) for w, r, a in zip(weights, routes, acts, strict=True)], layers)
        rows.append(dict(shape=name, tokens=tokens, part=kernel, blocks=blocks, us=us))
        print(f"{name:8s} tokens={tokens:3d} {kernel:26s} {blocks}: {us:7.2f} µs", flush=True)
    return rows


def best(rows: list[dict], part: str):
    return min((r for r in rows if r["part"] == part), key=lambda r: r["us"])["blocks"]


def whole_layers(name: str, shape, weights, tokens: list[int], counters, tuned) -> list[dict]:
    hidden, experts, routed, slots, _ = shape
    shared, rows = experts - routed, []

    def before(x, w):
        weights_, ids = route_topk(F.linear(x, w[0]), slots - shared, True, shared)
        return expert_down(expert_gate_up(x, w[1], ids, BEFORE), w[2], weights_, ids, BEFORE)

    def now(x, w):
        weights_, ids = route_folded(x, w[0], counters, slots - shared, True, shared)
        return expert_gemv(x, w[1], w[2], weights_, ids)

    def best_found(x, w):
        weights_, ids = route_folded(x, w[0], counters, slots - shared, True, shared, tuned[0])
        return expert_down(expert_gate_up(x, w[1], ids, tuned[1]), w[2], weights_, ids, tuned[2])

    def grouped(x, w):
        return grouped_experts(x, w[1], w[2], *route_topk(F.linear(x, w[0]), slots - shared, True, shared))

    for n in tokens:
        x = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16)
        paths = [("before", before), ("now", now), ("best found", best_found)] if n * slots <= 128 else []
        for path, fn in paths + ([("grouped", grouped)] if n * slots >= 128 else []):
            us = time_us(lambda fn=fn: [fn(x, w) for w in weights], len(weights))
            rows.append(dict(shape=name, tokens=n, pairs=n * slots, part=f"layer {path}", us=us))
            print(f"{name:8s} tokens={n:3d} pairs={n * slots:4d} layer {path:10s}: {us:7.2f} µs", flush=True)
    return rows


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sweep-tokens", default="1,8")
    p.add_argument("--tokens", default="1,2,4,8,16,32")
    args = p.parse_args()
    counters = torch.zeros(128, dtype=torch.int32, device="cuda")
    rows = []
    for name, shape in SHAPES.items():
        weights = layer_weights(shape, args.layers)
        sweep = []
        for n in [int(t) for t in args.sweep_tokens.split(",")]:
            sweep += kernels_alone(name, shape, weights, n, counters)
        one = [r for r in sweep if r["tokens"] == 1]
        tuned = (best(one, "route_folded"), best(one, "expert_gate_up"), best(one, "expert_down"))
        print(f"{name}: best at 1 token: router {tuned[0]}, gate_up {tuned[1]}, down {tuned[2]}", flush=True)
        rows += sweep + whole_layers(name, shape, weights, [int(t) for t in args.tokens.split(",")], counters, tuned)
        del weights
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_moe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
