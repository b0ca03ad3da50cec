"""Where a walk's time goes under load: B requests of one path in a closed loop, in process (no HTTP).

    PYTHONPATH=. python benchmarks/profile_walk.py SKELETON --cells s2s@1,s2s@32,i2t@1,i2t@32 --out DIR
    PYTHONPATH=. python benchmarks/profile_walk.py /tmp/tiny --device cpu --cells s2s@2 --steps 6 --out DIR

Each cell keeps B requests of the path's fixed work (``omniwalk.bench.workload`` presets: the
sweep's inputs and lengths) in flight: when one finishes, the next is added. After a warm-up of
B finished requests, three windows of engine steps (``--steps``, the profiled one ``--profile-steps``):

    free      the engine as it runs, no synchronisation added: wall ms per engine step, and how
              often each stage had work (its batch size per step)
    clocked   every stage's step() + finish() synchronised and timed (micro.py's StageClock):
              ms per engine step by stage (the GPU work of a stage, plus its host time)
    profiled  torch profiler (CUDA): GPU kernel time per stage (kernels launched inside its
              step(), graph replays included), by kernel kind, and the GPU's busy share of the wall

Writes ``profile.json`` and ``profile.md`` to ``--out`` after every cell.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when not installed
from harness import add_option_argument, markdown_table, synchronize  # noqa: E402
from micro import CPU_OPTIONS, StageClock  # noqa: E402
from smoke_full import FULL_OPTIONS  # noqa: E402

from omniwalk import Omni  # noqa: E402
from omniwalk.bench.workload import PRESETS, request_body  # noqa: E402

# Kernel kinds by name, first match wins (cuBLAS/CUTLASS/Triton/ATen naming on Hopper).
KINDS = (
    ("grouped gemm", r"grouped|GroupProblem|ptr_array"),
    ("gemm", r"gemm|cutlass|nvjet|xmma|cublas|wgmma|splitK|matmul"),
    ("attention", r"attn|attention|fmha|flash|paged_decode|varlen|sdpa"),
    ("norm", r"rms_norm|norm"),
    ("conv", r"conv|winograd|cudnn"),
    ("sort / top-k", r"sort|scan|cumsum|radix|topk|bitonic"),
    ("gather / scatter", r"index|scatter|gather|embedding"),
    ("reduce / softmax", r"reduce|softmax"),
    ("elementwise / copy", r"elementwise|vectorized|unrolled|fill|copy|cat"),
    ("memcpy / memset", r"memcpy|memset"),
)


def kind_of(kernel: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, kernel, re.IGNORECASE)), "other")


class ClosedLoop:
    """B requests of one path in flight; a finished one is replaced by the next."""

    def __init__(self, omni: Omni, path: str, batch: int):
        self.omni, self.work, self.batch = omni, PRESETS[path], batch
        self.seed, self.finished, self.running = 0, 0, []
        self.top_up()

    def top_up(self) -> None:
        while len(self.running) < self.batch:
            self.running.append(self.omni.add(request_body(self.work, "omni", self.seed)))
            self.seed += 1

    def step(self) -> None:
        self.omni.engine.step()
        for req in [r for r in self.running if r.status.is_done]:
            if req.error is not None:
                raise RuntimeError(f"request {req.id} failed: {req.error!r}") from req.error
            self.running.remove(req)
            self.finished += 1
        self.top_up()

    def close(self) -> None:
        for req in self.running:
            self.omni.abort(req.id)
        self.running = []


def free_window(loop: ClosedLoop, steps: int, device) -> dict:
    """Engine steps as they run: wall per step, finished requests, each stage's mean batch."""
    stages = loop.omni.engine.stages
    batches: dict[str, list[int]] = {name: [] for name in stages}
    synchronize(device)
    start, finished = time.perf_counter(), loop.finished
    for _ in range(steps):
        loop.step()
        for name, stage in stages.items():
            batches[name].append(stage.last_batch_size)
    synchronize(device)
    seconds = time.perf_counter() - start
    return {
        "ms_per_step": seconds / steps * 1e3,
        "finished_per_s": (loop.finished - finished) / seconds,
        "mean_batch": {name: statistics.mean(b) for name, b in batches.items()},
        "busy_steps": {name: sum(1 for x in b if x) / steps for name, b in batches.items()},
    }


def clocked_window(loop: ClosedLoop, steps: int, device) -> dict:
    """Every stage's step() + finish() synchronised: ms per engine step by stage."""
    start = time.perf_counter()
    with StageClock(loop.omni.engine, device) as clock:
        for _ in range(steps):
            loop.step()
    seconds = time.perf_counter() - start
    return {"ms_per_step": seconds / steps * 1e3, "stage_ms": {n: sum(ms) / steps for n, ms in clock.ms.items()}}


def descendants(event):
    yield event
    for child in event.cpu_children:
        yield from descendants(child)


def profiled_window(loop: ClosedLoop, steps: int, device) -> dict:
    """Kernels per stage and kind (µs per engine step), the top kernels, the GPU's busy share."""
    engine = loop.omni.engine
    for name, stage in engine.stages.items():  # instance attributes shadow the methods
        stage.step = annotated(f"stage:{name}", stage.step)
    try:
        synchronize(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                loop.step()
            synchronize(device)
            wall_us = (time.perf_counter() - start) * 1e6
    finally:
        for stage in engine.stages.values():
            del stage.step
    events = prof.events()
    by_stage: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for event in events:
        if event.device_type == DeviceType.CPU and event.name.startswith("stage:"):
            for sub in descendants(event):
                for kernel in sub.kernels:
                    cell = by_stage[event.name[6:]][kind_of(kernel.name)]
                    cell[0] += 1
                    cell[1] += kernel.duration
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    top: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        top[k.name][0] += 1
        top[k.name][1] += k.time_range.elapsed_us()
    busy = union_us([(k.time_range.start, k.time_range.end) for k in kernels])
    per_step = lambda cell: {"kernels": cell[0] / steps, "us": cell[1] / steps}  # noqa: E731
    return {
        "wall_ms_per_step": wall_us / steps / 1e3,
        "gpu_busy_share": busy / wall_us,
        "kernels_per_step": len(kernels) / steps,
        "stages": {s: {kind: per_step(c) for kind, c in kinds.items()} for s, kinds in by_stage.items()},
        "top_kernels": [
            {"name": name[:90], "kind": kind_of(name), **per_step(c)}
            for name, c in sorted(top.items(), key=lambda item: -item[1][1])[:15]
        ],
    }


def annotated(name: str, method):
    def run():
        with record_function(name):
            return method()

    return run


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def profile_cell(omni: Omni, path: str, batch: int, args, device) -> dict:
    loop = ClosedLoop(omni, path, batch)
    while loop.finished < batch * args.warmup_waves:  # into steady state: every phase of a request present
        loop.step()
    try:
        row = {"path": path, "batch": batch, "steps": args.steps, "profile_steps": args.profile_steps}
        row["free"] = free_window(loop, args.steps, device)
        row["clocked"] = clocked_window(loop, args.steps, device)
        row["profiled"] = profiled_window(loop, args.profile_steps, device)
        return row
    finally:
        loop.close()
        while omni.engine.has_unfinished():
            omni.engine.step()


def report(rows: list[dict]) -> str:
    lines = ["# Where the walk's time goes (profile_walk.py)", ""]
    for row in rows:
        free, clocked, prof = row["free"], row["clocked"], row["profiled"]
        lines += [
            f"## {row['path']} at B={row['batch']} ({row['steps']} engine steps free and clocked, "
            f"{row['profile_steps']} profiled)",
            "",
            f"- free-running: {free['ms_per_step']:.2f} ms per engine step, {free['finished_per_s']:.2f} requests "
            f"finished per s; profiled: GPU busy {prof['gpu_busy_share']:.0%} of the wall, "
            f"{prof['kernels_per_step']:.0f} kernels per step",
            "",
        ]
        stage_rows = []
        for name, ms in clocked["stage_ms"].items():
            kinds = prof["stages"].get(name, {})
            gpu = sum(c["us"] for c in kinds.values()) / 1e3
            count = sum(c["kernels"] for c in kinds.values())
            biggest = sorted(kinds.items(), key=lambda item: -item[1]["us"])[:3]
            stage_rows.append(
                [
                    name,
                    f"{free['busy_steps'][name]:.0%}",
                    f"{free['mean_batch'][name]:.1f}",
                    f"{ms:.2f}",
                    f"{gpu:.2f}",
                    f"{count:.0f}",
                    ", ".join(f"{k} {c['us'] / 1e3:.2f}" for k, c in biggest),
                ]
            )
        header = ["stage", "steps with work", "mean batch", "clocked ms/step", "GPU ms/step", "kernels/step"]
        lines += [markdown_table(header + ["largest kinds (ms/step)"], stage_rows), ""]
        top = [[k["name"], k["kind"], f"{k['kernels']:.1f}", f"{k['us']:.0f}"] for k in prof["top_kernels"]]
        lines += [markdown_table(["kernel", "kind", "per step", "µs per step"], top), ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="checkpoint or weightless skeleton directory")
    parser.add_argument("--cells", default="s2s@1,s2s@32,i2t@1,i2t@32", help="PATH@B,... (paths of bench)")
    parser.add_argument("--steps", type=int, default=60, help="engine steps in the free and clocked windows")
    parser.add_argument("--profile-steps", type=int, default=20, help="engine steps in the profiled window")
    parser.add_argument("--warmup-waves", type=int, default=1, help="finished requests before timing, x B")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    add_option_argument(parser, "Omni")
    args = parser.parse_args()
    device = torch.device(args.device)
    base = FULL_OPTIONS if device.type == "cuda" else CPU_OPTIONS
    cells = [(c.split("@")[0], int(c.split("@")[1])) for c in args.cells.split(",")]
    omni = Omni(model=args.model, **{**base, "max_running": max(64, *(b for _, b in cells)), **dict(args.option)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path, batch in cells:
        start = time.perf_counter()
        rows.append(profile_cell(omni, path, batch, args, device))
        print(f"{path} B={batch}: profiled in {time.perf_counter() - start:.0f}s", flush=True)
        (out / "profile.json").write_text(json.dumps(rows, indent=1))
        (out / "profile.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
