"""The code predictor's frame: the layered fused kernels vs the persistent kernels (``kernels/persistent.py``,
Triton; ``kernels/cuda_frame.py``, CUDA).

    PYTHONPATH=. python benchmarks/kernels/persistent.py --out DIR [--batches 1,2,4] [--programs 0.5,1,2] [--cuda]

Full-size code predictor (the packaged Qwen3-Omni config), random bf16 weights on the GPU, sampled draws
as served (temperature 1, top-k 50, top-p 0.8). Per batch B: microseconds per frame replayed from a CUDA
graph of 8 frames, the layered path and the persistent kernel at each ``--programs`` (programs per SM),
the best of those without its tiles' L2 prefetch of their weights (before they wait), and the frame's
weight-read floor (bytes it reads at the measured copy rate); ``--cuda``: the CUDA kernel's frame too (its
codes checked equal between a graph replay and an eager launch). Then one frame of the Triton kernel at the
first batch traced (each tile's start, end of its wait, end: per op, the mean time a tile waits and works),
and with ``--cuda`` one of the CUDA kernel (per step kind its phases and the time before it; its raw stamps in
cuda_trace.pt). Writes persistent.json/.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import copy_gbs, graph_call_us, int_list, machine, markdown_table, write_report  # noqa: E402

from omniwalk.kernels.persistent_schedule import OPS  # noqa: E402
from omniwalk.layers.decoder import use_kernels  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS, load_config_dict  # noqa: E402
from omniwalk.models.qwen3_omni.networks.talker import CodePredictor  # noqa: E402
from omniwalk.sampling import BatchParams, SamplerState, SamplingParams, draw  # noqa: E402


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int_list, default=[1, 2, 4])
    p.add_argument("--programs", type=float_list, default=[0.5, 1, 2], help="programs per SM")
    p.add_argument("--cuda", action="store_true", help="time the CUDA kernel (kernels/cuda_frame.py) too")
    args = p.parse_args()
    cfg, cp, cuda_frame = _code_predictor(args.cuda)
    gbs = copy_gbs()
    frame_bytes = cp.persistent.weights.frame_bytes()
    floor_us = frame_bytes / (gbs * 1e3)
    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    rows, data = [], {"machine": machine("cuda"), "copy_gbs": gbs, "frame_mb": frame_bytes / 1e6, "cells": []}
    for batch in args.batches:
        params = _params(batch, cfg.code_predictor.vocab_size)
        h = torch.randn(batch, cfg.code_predictor.hidden_size, device="cuda", dtype=torch.bfloat16)
        c = torch.randn_like(h)
        with torch.no_grad():
            layered = graph_call_us(lambda i: cp(h, c, lambda x, g: draw(x, params, g)), 8)  # noqa: B023
            cell = {"batch": batch, "layered_us": layered, "floor_us": floor_us, "persistent_us": {}}
            for per_sm in args.programs:
                cp.persistent.programs = max(1, round(per_sm * sms))
                cell["persistent_us"][per_sm] = graph_call_us(lambda i: cp.persistent(h, c, params), 8)  # noqa: B023
            best = min(cell["persistent_us"], key=cell["persistent_us"].get)
            cp.persistent.programs, cp.persistent.prefetches = max(1, round(best * sms)), False
            cell["no_prefetch_us"] = graph_call_us(lambda i: cp.persistent(h, c, params), 8)  # noqa: B023
            cp.persistent.prefetches = True
            if batch == args.batches[0]:
                data["timeline"] = _timeline(cp.persistent, h, c, params, batch)
            if cuda_frame is not None:
                cell["cuda_us"] = _cuda_us(cuda_frame, h, c, params)
                if batch == args.batches[0]:
                    data["cuda_timeline"] = _cuda_timeline(cuda_frame, h, c, params, batch, args.out)
        row = [batch, layered, *cell["persistent_us"].values(), best, cell["no_prefetch_us"]]
        rows.append([*row, *([cell["cuda_us"]] if cuda_frame else []), floor_us])
        print(
            f"B={batch}: layered {layered:.0f} us, persistent per SM {cell['persistent_us']}, "
            f"CUDA {cell.get('cuda_us', float('nan')):.0f} us, floor {floor_us:.0f}",
            flush=True,
        )
        data["cells"].append(cell)
    per_sm = [f"persistent, {x:g}/SM (us)" for x in args.programs]
    headers = ["B", "layered (us)", *per_sm, "best /SM", "best, no L2 prefetch (us)"]
    headers += [*(["CUDA kernel (us)"] if cuda_frame else []), "floor (us)"]
    note = f"{data['machine']['device']}, copy {gbs:.0f} GB/s, {frame_bytes / 1e6:.0f} MB of weights a frame"
    write_report(args.out, "persistent", data, _text(data, args.batches[0], note, markdown_table(headers, rows)))


def _code_predictor(cuda: bool):
    """The full-size code predictor, random bf16 weights on the GPU, the fused kernels and the Triton kernel
    (``cuda``: the CUDA kernel too, made first) -> (talker config, module, the CUDA kernel or None)."""
    cfg = Qwen3OmniConfig.from_hf(load_config_dict(PRESETS["qwen3-omni-30b-a3b"])).talker
    with torch.device("cuda"):
        cp = CodePredictor(cfg.code_predictor, cfg.num_code_groups).to(torch.bfloat16).eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for param in cp.parameters():
            noise = torch.randn(param.shape, generator=gen, device="cuda")
            param.copy_(1.0 + 0.1 * noise if param.dim() == 1 else noise / param.shape[-1] ** 0.5)
    use_kernels(cp, "fused")
    cuda_frame = None
    if cuda:
        cp.use_persistent_kernel("cuda")
        cuda_frame = cp.persistent
    cp.use_persistent_kernel()
    return cfg, cp, cuda_frame


def _text(data: dict, batch: int, note: str, table: str) -> str:
    """The report: the frames' table, then each traced frame's steps."""
    timeline = data["timeline"]
    ops = markdown_table(
        [
            f"op (B = {batch}, one traced frame)",
            "tiles",
            "waiting, mean us",
            "working, mean us",
            "step span, mean us",
        ],
        [[op, *v] for op, v in timeline["ops"].items()],
    )
    spans = f"The traced frame: {timeline['frame_us']:.0f} us from its first tile's start to its last tile's end."
    text = f"{note}\n\n{table}\n\n{ops}\n\n{spans}"
    if "cuda_timeline" in data:
        cuda_ops = data["cuda_timeline"]["ops"]
        cuda_headers = [f"CUDA kernel's step (B = {batch}, one traced frame)", *CUDA_PHASES]
        text += "\n\n" + markdown_table(cuda_headers, [[op, *v] for op, v in cuda_ops.items()])
        cuda = data["cuda_timeline"]
        text += f"\n\nThe CUDA kernel's traced frame: {cuda['frame_us']:.0f} us; a block's {cuda['busy_us']:.0f} us in "
        text += f"steps and draws, {cuda['between_us']:.0f} us between them (mean us a step, thread 0 of each block; "
        text += "draw: its first request's logits read, then the rest)."
    return text


def _timeline(kernel, h, c, params, batch: int) -> dict:
    """One frame traced (``PersistentCodePredictor.trace``: each tile's start, end of its wait, end): per op,
    its tiles' mean time waiting (from their start, weights' prefetch included) and working, and a step's mean
    span (its first tile's start to its last tile's end); the frame's span."""
    schedule = kernel.schedules[batch]
    kernel.trace = torch.zeros(schedule.num_tiles, 4, dtype=torch.int64, device="cuda")
    with torch.no_grad():
        kernel(h, c, params)
    torch.cuda.synchronize()
    stamps, kernel.trace = kernel.trace.cpu(), None
    start, waited, end = stamps[:, 0], stamps[:, 1], stamps[:, 2]
    waited = torch.where(waited > 0, waited, start)  # (the frame's first tiles wait for nothing)
    ops = {}
    for i, op in enumerate(OPS):
        steps = [s for s in schedule.steps if s.op == i]
        if not steps:
            continue
        tiles = torch.cat([torch.arange(s.first, s.first + s.tiles) for s in steps])
        span = sum(
            (end[s.first : s.first + s.tiles].max() - start[s.first : s.first + s.tiles].min()).item() for s in steps
        )
        wait = (waited[tiles] - start[tiles]).double().mean().item() / 1e3
        work = (end[tiles] - waited[tiles]).double().mean().item() / 1e3
        step_us = span / len(steps) / 1e3
        ops[op] = (len(tiles), round(wait, 2), round(work, 2), round(step_us, 2))
        print(f"  {op}: {len(tiles)} tiles, waiting {wait:.2f} us, working {work:.2f} us, a step {step_us:.2f} us")
    return {"ops": ops, "frame_us": (end.max() - start.min()).item() / 1e3}


def _cuda_us(kernel, h, c, params) -> float:
    """The CUDA kernel's frame from a graph of 8 (its codes first checked: a replay equals an eager launch,
    and no wait gave up)."""
    eager = kernel(h, c, params)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = kernel(h, c, params)
    graph.replay()
    torch.cuda.synchronize()
    kernel.check()
    if not (torch.equal(eager[0], replayed[0]) and torch.equal(eager[1], replayed[1])):
        raise SystemExit("the CUDA kernel's graph replay differs from its eager launch")
    return graph_call_us(lambda i: kernel(h, c, params), 8)


CUDA_PHASES = ("input (the wait)", "weights in", "rows", "whole step", "before the step")
CUDA_OPS = ("QKV", "ATTN", "OUT", "GATE_UP", "DOWN")


def _cuda_timeline(kernel, h, c, params, batch: int, out: Path) -> dict:
    """One frame of the CUDA kernel traced (each block's timer at each step's start, input read, weights in,
    end, and at each draw's; the stamps saved as ``out/cuda_trace.pt``): ``cuda_phases`` of it."""
    plan = kernel.plan(batch)
    kernel.trace = torch.zeros(plan.blocks, plan.trace_rows, 4, dtype=torch.int64, device="cuda")
    with torch.no_grad():
        kernel(h, c, params)
    torch.cuda.synchronize()
    t, kernel.trace = kernel.trace.cpu(), None
    out.mkdir(parents=True, exist_ok=True)
    torch.save(t, out / "cuda_trace.pt")
    phases = cuda_phases(t, plan.layers, batch * plan.kv_heads)
    for op, v in phases["ops"].items():
        print(f"  CUDA {op}: {dict(zip(CUDA_PHASES, v, strict=True))}")
    print(f"  CUDA draw: its top-k / top-p set {phases['draw_selection_us']:.2f} us (first request)")
    print(f"  CUDA a block's frame: {phases['busy_us']:.0f} us in steps and draws, {phases['between_us']:.0f} between")
    return phases


def cuda_phases(trace: torch.Tensor, layers: int, attending: int) -> dict:
    """A traced frame (``trace`` [blocks, steps + passes, 4] ns, ``FramePlan.trace_rows``: the steps, then each
    pass's draw; the last ``attending`` blocks attend): per step kind, the mean microseconds of each phase over
    blocks and steps (ATTN: on the blocks that attend) and the time before the step (from what the block did
    last: what it did between them); the draws between passes (the first request's logits read, then the rest);
    a block's mean time in steps and draws and between them; the frame's span."""
    t = trace.double() / 1e3
    blocks, rows, _ = t.shape
    per_pass = 5 * layers + 1
    if rows % (per_pass + 1):
        raise ValueError(f"{rows} rows of stamps are not passes of {per_pass} steps and a draw")
    passes = rows // (per_pass + 1)
    steps = passes * per_pass
    kinds = [CUDA_OPS[i % per_pass % 5] if i % per_pass < 5 * layers else "HEAD" for i in range(steps)]
    order = []  # a block's rows in the order it runs them: a pass's steps, then its draw (but the last pass's)
    for i in range(steps):
        order.append(i)
        if kinds[i] == "HEAD" and i // per_pass < passes - 1:
            order.append(steps + i // per_pass)
    seq = t[:, order]
    gaps = torch.cat([torch.zeros(blocks, 1, dtype=t.dtype), seq[:, 1:, 0] - seq[:, :-1, 3]], dim=1)
    before = {row: gaps[:, at] for at, row in enumerate(order)}
    ops = {}
    for op in (*CUDA_OPS, "HEAD"):
        mine = [i for i, k in enumerate(kinds) if k == op and i > 0]
        x = t[blocks - attending :][:, mine] if op == "ATTN" else t[:, mine]
        spans = [x[..., 1] - x[..., 0], x[..., 2] - x[..., 1], x[..., 3] - x[..., 2], x[..., 3] - x[..., 0]]
        gap = torch.stack([before[i] for i in mine], dim=1).mean().item()
        means = [round(span.mean().item(), 2) for span in spans] + [round(gap, 2)]
        ops[op] = ["-", "-", "-", means[3], means[4]] if op == "ATTN" else means  # (ATTN: its whole step alone)
    draws = list(range(steps, steps + passes - 1))
    x = t[:, draws]
    spans = [x[..., 1] - x[..., 0], x[..., 3] - x[..., 1], x[..., 3] - x[..., 0]]
    gap = torch.stack([before[i] for i in draws], dim=1).mean().item()
    wait, rest, whole = (round(span.mean().item(), 2) for span in spans)
    ops["draw"] = [wait, "-", rest, whole, round(gap, 2)]  # (the first request's logits read, then the rest)
    return {
        "ops": ops,
        "draw_selection_us": (x[..., 2] - x[..., 1]).mean().item(),  # (its top-k / top-p set, first request)
        "busy_us": (seq[..., 3] - seq[..., 0]).sum(1).mean().item(),
        "between_us": gaps.sum(1).mean().item(),
        "frame_us": (seq[..., 3].max() - seq[..., 0].min()).item(),
    }


def _params(batch: int, vocab: int) -> BatchParams:
    states = [SamplerState(SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=i), (), []) for i in range(batch)]
    return BatchParams.of(states, vocab, "cuda")


if __name__ == "__main__":
    main()
