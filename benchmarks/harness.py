"""What every micro-benchmark script shares: ``--option`` parsing, device timing, report files.

    --option name=value     repeated; the value is read as bool (true/false), None (none), int,
                            float or else a string, and handed to the system under test as a
                            keyword argument (``Omni(**options)``, HF's ``_from_config``)

Timing is synchronised wall time: on CUDA a pair of events around the call (the host time of a
launch-bound call is in it, since the end event is recorded after the call returns), on the CPU
``perf_counter``. Figures are medians over repeats, after warm-up calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The full-size model on one GPU: random bf16 weights built on the device, fused MoE, 8 + 2 GiB of KV
# (``Omni(model=SKELETON, **FULL_OPTIONS)``; a skeleton comes from ``omniwalk make-tiny DIR --config PRESET
# --no-weights``).
FULL_OPTIONS = dict(
    device="cuda",
    dtype="bfloat16",
    moe_backend="fused",
    random_weights=True,
    thinker_kv_bytes=8 * 2**30,
    talker_kv_bytes=2 * 2**30,
)

WORDS = "sea ship storm harbour island lighthouse whale sailor wind night star map coral tide gull reef".split()


def prompt_text(i: int, num_words: int = 24) -> str:
    """The user text of request ``i``, the same in every benchmark that compares systems on text
    work. Requests get different words (seeded), so even a random-weight model decodes them
    differently and a batch routes its tokens to different experts, as real traffic does."""
    rng = random.Random(i)
    return f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(num_words)) + ". Tell me a long story."


def parse_value(text: str):
    """'true' -> True, 'none' -> None, '8' -> 8, '0.5' -> 0.5, anything else stays a string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--option takes name=value, got {text!r}")
    return name.replace("-", "_"), parse_value(value)


def add_option_argument(parser: argparse.ArgumentParser, target: str) -> None:
    parser.add_argument(
        "--option",
        type=parse_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"keyword argument for {target} (repeatable); overrides the defaults",
    )


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], device, *, warmup: int = 2, iters: int = 5) -> float:
    """Median synchronised wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        if torch.device(device).type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def replay_us(graph, replays: int = 20) -> float:
    """Mean microseconds per replay of a captured CUDA graph (one warm replay first, device events)."""
    import torch

    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def graph_call_us(fn: Callable[[int], object], calls: int, replays: int = 5) -> float:
    """Mean microseconds per call of ``fn(i)``, i = 0 .. calls - 1 captured in one CUDA graph and
    replayed ``replays`` times (after one eager ``fn(0)``: it loads or compiles the variant)."""
    import torch

    fn(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    us = replay_us(graph, replays) / calls
    del graph
    return us


def copy_gbs() -> float:
    """The GPU's copy rate: bytes read and written a second by a 1 GiB device-to-device copy, in GB/s."""
    import torch

    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = graph_call_us(lambda i: b.copy_(a), 4)
    return 2 * a.numel() / (us * 1e3)


def timed_seconds(fn: Callable[[], object], device) -> tuple[object, float]:
    """(fn(), synchronised wall seconds) for one long call."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def machine(device) -> dict:
    """Where and what ran: device name, versions, the repository commit (dirty marked)."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    is_cuda = torch.device(device).type == "cuda"
    return {
        "device": torch.cuda.get_device_name() if is_cuda else f"cpu ({platform.processor() or platform.machine()})",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": commit or "unknown",
    }


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(out: Path, stem: str, data: dict, markdown: str) -> None:
    """``out/stem.json`` (raw numbers) and ``out/stem.md`` (the tables)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown + "\n")
