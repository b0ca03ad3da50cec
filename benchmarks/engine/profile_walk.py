"""Where a walk's time goes under load: B requests of one path in a closed loop, in process (no HTTP).

    python benchmarks/engine/profile_walk.py SKELETON --cells s2s@1,s2s@32,i2t@1,i2t@32 --out DIR
    python benchmarks/engine/profile_walk.py /tmp/tiny --device cpu --cells s2s@2 --steps 6 --out DIR
    python benchmarks/engine/profile_walk.py SKELETON --windows free --steps 300 --out DIR \
        --cells "i2t@32,i2t@32:thinker.max_batch_tokens=4096,i2t@32:vision_encoder.max_batch_units=8192"

A cell ``PATH@B:STAGE.FIELD=VALUE,...`` (``;`` between several fields) runs with that field of the
stage's scheduling config replaced for the cell (the same model and graphs: a what-if on budgets).

Each cell keeps B requests of the path's fixed work (``omniwalk.bench.workload`` presets: the
sweep's inputs and lengths) in flight: when one finishes, the next is added. After a warm-up of
B finished requests, three windows of engine steps (``--steps``, the profiled one ``--profile-steps``):

    free      the engine as it runs, no synchronisation added: wall ms per engine step, how
              often each stage had work (its batch size per step), the host time of each stage's
              step() (launches and bookkeeping, not waiting) and of adding requests, and the engine's
              TTFT (add -> the first step after which the request has text out)
    clocked   every stage's step() + finish() synchronised and timed (micro_clock.py's StageClock):
              ms per engine step by stage (the GPU work of a stage, plus its host time)
    profiled  the clocked window again under the torch profiler: each kernel (graph replays
              included) is counted to the stage that was running when it started; kernels and GPU
              time per engine step by stage and kernel kind, and the top kernels
    busy      the free window again under the profiler, nothing synchronised: the share of the wall
              time in which some kernel ran (the union of kernel intervals: "GPU busy"), and the
              overlap (kernel time summed over that union: > 1 when stages' streams run at once)

Writes ``profile.json`` and ``profile.md`` to ``--out`` after every cell; with ``--python`` also
``python.txt``: one more free window under cProfile (the host's time by Python function).
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import dataclasses
import io
import json
import pstats
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import FULL_OPTIONS, add_option_argument, markdown_table, synchronize  # noqa: E402
from micro import CPU_OPTIONS  # noqa: E402
from micro_clock import StageClock  # noqa: E402

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
    """B requests of one path in flight; a finished one is replaced by the next. Request bodies
    (synthetic inputs, made by the load generator in a sweep) are made up front: 2B of them, reused."""

    def __init__(self, omni: Omni, path: str, batch: int):
        self.omni, self.batch = omni, batch
        self.bodies = [request_body(PRESETS[path], "omni", seed) for seed in range(2 * batch)]
        self.seed, self.finished, self.running, self.add_seconds = 0, 0, [], 0.0
        self.added: dict[str, tuple[float, int]] = {}  # request id -> (time, engine step) of its add
        self.ttft: list[tuple[float, int]] = []  # (seconds, engine steps) from add to its first text
        self.steps = 0
        self.top_up()

    def top_up(self) -> None:
        start = time.perf_counter()
        while len(self.running) < self.batch:
            body = {**self.bodies[self.seed % len(self.bodies)], "request_id": f"walk-{self.seed}"}
            req = self.omni.add(body)
            self.running.append(req)
            self.added[req.id] = (time.perf_counter(), self.steps)
            self.seed += 1
        self.add_seconds += time.perf_counter() - start

    def step(self) -> None:
        self.omni.engine.step()
        self.steps += 1
        now = time.perf_counter()
        for req in self.running:  # engine TTFT: the first step after which the request has text out
            if req.id in self.added and any(e.kind == "text" for e in req.events):
                at, step = self.added.pop(req.id)
                self.ttft.append((now - at, self.steps - step))
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
    """Engine steps as they run: wall per step, finished requests, each stage's mean batch, the
    host time of each stage's step() (its launches, unsynchronised) and of adding requests."""
    stages = loop.omni.engine.stages
    batches: dict[str, list[int]] = {name: [] for name in stages}
    host = {name: 0.0 for name in stages}
    for name, stage in stages.items():  # instance attributes shadow the methods
        stage.step = host_timed(host, name, stage.step)
    synchronize(device)
    start, finished, adding = time.perf_counter(), loop.finished, loop.add_seconds
    ttft_from = len(loop.ttft)
    try:
        for _ in range(steps):
            loop.step()
            for name, stage in stages.items():
                batches[name].append(stage.last_batch_size)
        synchronize(device)
    finally:
        for stage in stages.values():
            del stage.step
    seconds = time.perf_counter() - start
    ttft = sorted(loop.ttft[ttft_from:])
    return {
        "ms_per_step": seconds / steps * 1e3,
        "finished_per_s": (loop.finished - finished) / seconds,
        "ttft": {  # in process: from Omni.add to the first step whose end finds text out
            "count": len(ttft),
            "p50_s": ttft[len(ttft) // 2][0] if ttft else None,
            "p90_s": ttft[int(len(ttft) * 0.9)][0] if ttft else None,
            "p50_steps": sorted(s for _, s in ttft)[len(ttft) // 2] if ttft else None,
        },
        "add_ms_per_step": (loop.add_seconds - adding) / steps * 1e3,
        "launch_ms": {name: t / steps * 1e3 for name, t in host.items()},
        "mean_batch": {name: statistics.mean(b) for name, b in batches.items()},
        "busy_steps": {name: sum(1 for x in b if x) / steps for name, b in batches.items()},
    }


def python_window(loop: ClosedLoop, steps: int, device, top: int = 40) -> str:
    """The engine as it runs, under cProfile: the host's time by Python function (text)."""
    profiler = cProfile.Profile()
    synchronize(device)
    profiler.enable()
    for _ in range(steps):
        loop.step()
    synchronize(device)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def clocked_window(loop: ClosedLoop, steps: int, device) -> dict:
    """Every stage's step() + finish() synchronised: ms per engine step by stage."""
    start = time.perf_counter()
    with StageClock(loop.omni.engine, device) as clock:
        for _ in range(steps):
            loop.step()
    seconds = time.perf_counter() - start
    return {"ms_per_step": seconds / steps * 1e3, "stage_ms": {n: sum(ms) / steps for n, ms in clock.ms.items()}}


def profiled_window(loop: ClosedLoop, steps: int, device) -> dict:
    """Synchronised like the clocked window, under the profiler: each kernel belongs to the stage
    whose step() or finish() was running (synchronised on both sides) when it started. -> kernels
    and GPU µs per engine step by stage and kind, the top kernels."""
    engine = loop.omni.engine
    with StageClock(engine, device):
        for name, stage in engine.stages.items():  # around the clock's synchronised methods
            stage.step, stage.finish = annotated(f"stage:{name}", stage.step), annotated(f"stage:{name}", stage.finish)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                loop.step()
    events = prof.events()
    ranges = sorted(
        (e.time_range.start, e.time_range.end, e.name[6:])
        for e in events
        if e.device_type == DeviceType.CPU and e.name.startswith("stage:")
    )
    starts = [r[0] for r in ranges]
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith("stage:")]
    by_stage: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    top: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        at = bisect.bisect_right(starts, k.time_range.start) - 1
        stage = ranges[at][2] if at >= 0 and k.time_range.start <= ranges[at][1] else "(between stages)"
        for cell in (by_stage[stage][kind_of(k.name)], top[k.name]):
            cell[0] += 1
            cell[1] += k.time_range.elapsed_us()
    per_step = lambda cell: {"kernels": cell[0] / steps, "us": cell[1] / steps}  # noqa: E731
    return {
        "kernels_per_step": len(kernels) / steps,
        "kernel_ms_per_step": sum(k.time_range.elapsed_us() for k in kernels) / steps / 1e3,
        "stages": {s: {kind: per_step(c) for kind, c in kinds.items()} for s, kinds in by_stage.items()},
        "top_kernels": [
            {"name": name[:90], "kind": kind_of(name), **per_step(c)}
            for name, c in sorted(top.items(), key=lambda item: -item[1][1])[:15]
        ],
    }


def union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: the time in which some kernel ran."""
    union, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        union += max(0.0, b - max(a, end))
        end = max(end, b)
    return union


def busy_window(loop: ClosedLoop, steps: int, device) -> dict:
    """The engine as it runs (no synchronisation added), under the profiler: GPU busy share of the
    wall time (union of kernel intervals) and the overlap of kernels on different streams."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            loop.step()
        synchronize(device)
        seconds = time.perf_counter() - start
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    union = union_us(spans)
    total = sum(b - a for a, b in spans)
    return {
        "ms_per_step": seconds / steps * 1e3,
        "busy_ms_per_step": union / steps / 1e3,
        "busy_share": union / 1e6 / seconds,
        "overlap": total / union if union else 0.0,
    }


def host_timed(into: dict[str, float], name: str, method):
    def run():
        start = time.perf_counter()
        result = method()
        into[name] += time.perf_counter() - start
        return result

    return run


def annotated(name: str, method):
    def run():
        with record_function(name):
            return method()

    return run


def profile_cell(omni: Omni, cell: str, args, device) -> dict:
    path, batch, changes = parse_cell(cell)
    saved = {name: omni.engine.stages[name].config for name in changes}
    for name, fields in changes.items():
        omni.engine.stages[name].config = dataclasses.replace(saved[name], **fields)
    loop = ClosedLoop(omni, path, batch)
    try:
        while loop.finished < batch * args.warmup_waves:  # into steady state: every phase of a request present
            loop.step()
        row = {"cell": cell, "path": path, "batch": batch, "steps": args.steps, "profile_steps": args.profile_steps}
        row["free"] = free_window(loop, args.steps, device)
        if args.python:
            row["python"] = python_window(loop, args.steps, device)
        if args.windows == "all":
            row["busy"] = busy_window(loop, args.steps, device)
            row["clocked"] = clocked_window(loop, args.steps, device)
            row["profiled"] = profiled_window(loop, args.profile_steps, device)
        return row
    finally:
        loop.close()
        while omni.engine.has_unfinished():
            omni.engine.step()
        for name, config in saved.items():
            omni.engine.stages[name].config = config


def parse_cell(cell: str) -> tuple[str, int, dict[str, dict[str, int]]]:
    """``PATH@B[:STAGE.FIELD=VALUE;...]`` -> (path, B, {stage: {field: value}})."""
    head, _, tail = cell.partition(":")
    path, batch = head.split("@")
    changes: dict[str, dict[str, int]] = defaultdict(dict)
    for item in filter(None, tail.split(";")):
        key, value = item.split("=")
        stage, field = key.split(".")
        changes[stage][field] = int(value)
    return path, int(batch), dict(changes)


def report(rows: list[dict]) -> str:
    lines = ["# Where the walk's time goes (profile_walk.py)", ""]
    for row in rows:
        free = row["free"]
        title = f"## {row['cell']} ({row['steps']} engine steps free"
        if "profiled" not in row:
            lines += [
                title + ")",
                "",
                f"- free-running: {free['ms_per_step']:.2f} ms per engine step, {free['finished_per_s']:.2f} requests "
                f"finished per s; mean batch {', '.join(f'{k} {v:.1f}' for k, v in free['mean_batch'].items() if v)}",
                f"- engine TTFT (in process, add -> first text; {ttft_text(free['ttft'])})",
                "",
            ]
            continue
        clocked, prof, busy = row["clocked"], row["profiled"], row["busy"]
        lines += [
            title + f" and clocked, {row['profile_steps']} profiled)",
            "",
            f"- free-running: {free['ms_per_step']:.2f} ms per engine step, {free['finished_per_s']:.2f} requests "
            f"finished per s; {prof['kernels_per_step']:.0f} kernels per step taking "
            f"{prof['kernel_ms_per_step']:.2f} ms of GPU time; adding requests "
            f"(processing their inputs) {free['add_ms_per_step']:.2f} ms per step",
            f"- engine TTFT (in process, add -> first text; {ttft_text(free['ttft'])})",
            f"- GPU busy against the free-running step: {busy['busy_ms_per_step'] / free['ms_per_step']:.0%} "
            f"(the profiled window's busy ms per step over the free window's ms per step; the profiler's host "
            f"overhead stretches its own window)",
            f"- GPU busy (profiled free-running, {busy['ms_per_step']:.2f} ms per step): some kernel ran in "
            f"{busy['busy_share']:.0%} of the wall time ({busy['busy_ms_per_step']:.2f} ms per step); kernels "
            f"overlapping on streams: {busy['overlap']:.2f}x (summed kernel time / busy time)",
            "",
        ]
        stage_rows = []
        for name in [*clocked["stage_ms"], *(s for s in prof["stages"] if s not in clocked["stage_ms"])]:
            ms, kinds = clocked["stage_ms"].get(name), prof["stages"].get(name, {})
            gpu = sum(c["us"] for c in kinds.values()) / 1e3
            count = sum(c["kernels"] for c in kinds.values())
            biggest = sorted(kinds.items(), key=lambda item: -item[1]["us"])[:3]
            stage_rows.append(
                [
                    name,
                    f"{free['busy_steps'][name]:.0%}" if ms is not None else "-",
                    f"{free['mean_batch'][name]:.1f}" if ms is not None else "-",
                    f"{free['launch_ms'][name]:.2f}" if ms is not None else "-",
                    f"{ms:.2f}" if ms is not None else "-",
                    f"{gpu:.2f}",
                    f"{count:.0f}",
                    ", ".join(f"{k} {c['us'] / 1e3:.2f}" for k, c in biggest),
                ]
            )
        header = ["stage", "steps with work", "mean batch", "step() host ms", "clocked ms/step", "GPU ms/step"]
        header += ["kernels/step"]
        lines += [markdown_table(header + ["largest kinds (ms/step)"], stage_rows), ""]
        top = [[k["name"], k["kind"], f"{k['kernels']:.1f}", f"{k['us']:.0f}"] for k in prof["top_kernels"]]
        lines += [markdown_table(["kernel", "kind", "per step", "µs per step"], top), ""]
    return "\n".join(lines) + "\n"


def ttft_text(t: dict) -> str:
    if not t["count"]:
        return "no request reached its first token in the window"
    p50, p90 = t["p50_s"] * 1e3, t["p90_s"] * 1e3
    return f"{t['count']} requests: p50 {p50:.0f} ms / {t['p50_steps']} steps, p90 {p90:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="checkpoint or weightless skeleton directory")
    parser.add_argument("--cells", default="s2s@1,s2s@32,i2t@1,i2t@32", help="PATH@B,... (paths of bench)")
    parser.add_argument("--steps", type=int, default=60, help="engine steps in the free and clocked windows")
    parser.add_argument("--profile-steps", type=int, default=20, help="engine steps in the profiled window")
    parser.add_argument("--warmup-waves", type=int, default=1, help="finished requests before timing, x B")
    parser.add_argument("--python", action="store_true", help="also a cProfile window: python.txt")
    parser.add_argument("--windows", choices=("all", "free"), default="all", help="free: the free window only")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    add_option_argument(parser, "Omni")
    args = parser.parse_args()
    device = torch.device(args.device)
    base = FULL_OPTIONS if device.type == "cuda" else CPU_OPTIONS
    cells = args.cells.split(",")
    most = max(parse_cell(c)[1] for c in cells)
    omni = Omni(model=args.model, **{**base, "max_running": max(64, most), **dict(args.option)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cell in cells:
        start = time.perf_counter()
        rows.append(profile_cell(omni, cell, args, device))
        print(f"{cell}: profiled in {time.perf_counter() - start:.0f}s", flush=True)
        (out / "profile.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "python"} for r in rows]))
        if args.python:
            text = "".join(f"===== {r['cell']}\n{r['python']}\n" for r in rows)
            (out / "python.txt").write_text(text)
        (out / "profile.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
