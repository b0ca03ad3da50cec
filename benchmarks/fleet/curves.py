"""One engine replica as the fleet simulator sees it: measured service curves, per path and concurrency.

The curves are the served H200 sweep (``benchmarks/results/h200/qwen3-omni-30b-a3b/served_bf16.json``,
docs/performance.md "Qwen3-Omni-30B-A3B, served, H200"): for each path (s2t, i2t, s2s, i2s) and each
measured concurrency B (1 and 32), the p50 time to first text, to first audio and to the end of a
request. Between measured concurrencies a time is interpolated linearly in B; a replica runs at most
the largest measured B at once (further requests wait in its queue), so nothing is extrapolated.

A turn of a conversation also carries its conversation's earlier tokens (the prefix: instructions,
earlier inputs and answers). Those are prefilled unless the replica still holds their KV pages
(its prefix cache). The prefill rate is the measured s2t request at B = 1: its TTFT less one decode
step (its ITL) over its 168 prompt tokens (the HF baseline's count for the same 4 s clip) — an upper
bound on the cost of a token, as the audio encoder's time is in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omniwalk.bench.workload import PRESETS

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "benchmarks/results/h200/qwen3-omni-30b-a3b/served_bf16.json"
PATHS = ("s2t", "i2t", "s2s", "i2s")
S2T_PROMPT_TOKENS = 168  # the bench's 4 s clip as a Qwen3-Omni prompt (hf_baseline.md, same GPU kind)
# what one user turn adds to a conversation's tokens: 4 s of audio at 12.5 tokens a second, or a
# 640x480 image at one token per 32x32 pixels (16 px patches merged 2x2), plus ~8 of chat template
TURN_INPUT_TOKENS = {"s": 4 * 12.5 + 8, "i": (640 // 32) * (480 // 32) + 8}
# the thinker's KV bytes a token (48 layers x 4 KV heads x 128 dims x K and V x 2 bytes) and the sweep's pool
KV_BYTES_PER_TOKEN = 48 * 4 * 128 * 2 * 2
KV_POOL_BYTES = 16 * 2**30  # --thinker-kv-bytes of the sweep's server


@dataclass(frozen=True)
class Point:
    """p50 seconds of one request at one concurrency, from its arrival at the engine."""

    ttft: float
    first_audio: float | None  # None: a text-out path
    e2e: float


@dataclass(frozen=True)
class Curves:
    """Per path, ``table[path][n]`` is the ``Point`` at n requests running (n = 1 .. max_running)."""

    table: dict[str, list[Point | None]]
    max_running: int  # the largest measured concurrency
    throughput: dict[str, float]  # req/s at max_running (measured)
    prefill_s_per_token: float

    def at(self, path: str, n: int) -> Point:
        return self.table[path][n]


def load_curves(sweep: Path = SWEEP) -> Curves:
    cells = json.loads(sweep.read_text())["cells"]
    measured: dict[str, dict[int, Point]] = {path: {} for path in PATHS}
    throughput = {}
    for name, cell in cells.items():
        path, b = name.split("@")
        if path in measured:
            audio = cell.get("ttft_audio_p50")
            measured[path][int(b)] = Point(ttft=cell["ttft_text_p50"], first_audio=audio, e2e=cell["e2e_p50"])
    top = min(max(points) for points in measured.values())
    for path in PATHS:
        throughput[path] = cells[f"{path}@{top}"]["req_per_s"]
    s2t = cells[f"s2t@{min(measured['s2t'])}"]
    rate = (s2t["ttft_text_p50"] - s2t["itl_text_p50"]) / S2T_PROMPT_TOKENS
    table = {path: [None] + [interpolate(measured[path], n) for n in range(1, top + 1)] for path in PATHS}
    return Curves(table=table, max_running=top, throughput=throughput, prefill_s_per_token=rate)


def interpolate(points: dict[int, Point], n: int) -> Point:
    """The Point at concurrency n, linear between the nearest measured concurrencies around it."""
    if n in points:
        return points[n]
    lo = max(b for b in points if b < n)
    hi = min(b for b in points if b > n)
    w = (n - lo) / (hi - lo)

    def mix(a: float | None, b: float | None) -> float | None:
        return None if a is None else a + w * (b - a)

    p, q = points[lo], points[hi]
    return Point(ttft=mix(p.ttft, q.ttft), first_audio=mix(p.first_audio, q.first_audio), e2e=mix(p.e2e, q.e2e))


def turn_tokens(path: str) -> int:
    """Tokens one turn of ``path`` adds to its conversation: the user's input and the answer's text."""
    return round(TURN_INPUT_TOKENS[path[0]]) + PRESETS[path].text_tokens


def prefix_cache_tokens(max_running: int, running_tokens: int = 2048) -> int:
    """Tokens of prefix pages a replica keeps: its KV pool less the pages of ``max_running`` running
    requests of up to ``running_tokens`` each."""
    return KV_POOL_BYTES // KV_BYTES_PER_TOKEN - max_running * running_tokens
