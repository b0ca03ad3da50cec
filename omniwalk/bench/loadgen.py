"""Closed-loop load generator for any OpenAI-compatible omni server (streaming chat completions).

B requests are kept in flight (a semaphore); a cell sends N = max(min_requests,
requests_per_concurrency * B) measured requests after ``warmup_waves`` waves of B unmeasured
ones. Every request streams, so first text and first audio are timed where the client sees them;
its answer's text is checked where the workload has a notion of a valid answer (JSON out).

Request bodies (synthetic speech as WAV, photos as JPEG, each request its own input) are built and
JSON-encoded before the cell starts, in a process pool: built on the client's event loop they would
stall every stream's reads and cap a cell at what one core can synthesise.

While a cell runs, ``progress`` (if given) gets a line every ``progress_every_s`` seconds: requests
done of the cell's total (warm-up included) and the seconds elapsed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import httpx

from omniwalk.bench.workload import Workload, request_body

PCM_BYTES_PER_SECOND = 24000 * 2


@dataclass(frozen=True)
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # None: the first model the server's /v1/models lists
    api_key: str | None = None
    paths: tuple[str, ...] = ("s2t", "i2t", "s2s", "i2s")
    concurrency: tuple[int, ...] = (1, 4, 16, 32)
    min_requests: int = 50
    requests_per_concurrency: int = 10
    warmup_waves: int = 1
    request_timeout_s: float = 600.0


@dataclass
class RequestRecord:
    path: str
    concurrency: int
    start: float
    end: float = 0.0
    first_text: float | None = None
    first_audio: float | None = None
    text_times: list[float] = field(default_factory=list)
    audio_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    audio_seconds: float = 0.0
    valid: bool | None = None  # Workload.is_valid_answer of a finished request
    error: str | None = None

    @property
    def e2e(self) -> float:
        return self.end - self.start


def encoded_body(work: Workload, model: str | None, seed: int) -> bytes:
    return json.dumps(request_body(work, model, seed)).encode()


def encoded_bodies(work: Workload, model: str | None, seeds: list[int]) -> list[bytes]:
    """The JSON bodies of ``seeds``' requests, built on every core (deterministic per seed)."""
    with ProcessPoolExecutor(max_workers=min(len(seeds), os.cpu_count() or 1)) as pool:
        return list(pool.map(partial(encoded_body, work, model), seeds, chunksize=4))


async def one_request(
    http: httpx.AsyncClient, cfg: BenchConfig, work: Workload, b: int, seed: int, body: bytes
) -> RequestRecord:
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    record, text = RequestRecord(work.path, b, time.perf_counter()), []
    try:
        async with http.stream("POST", f"{cfg.base_url}/chat/completions", content=body, headers=headers) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return record
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text.append(_consume(record, json.loads(line[6:]), time.perf_counter()))
        if record.error is None:
            record.valid = work.is_valid_answer("".join(text), seed)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        record.error = f"{type(e).__name__}: {e}"
    finally:
        record.end = time.perf_counter()
    return record


def _consume(record: RequestRecord, chunk: dict, now: float) -> str:
    """Record one streamed chunk; -> its answer text."""
    text = ""
    if "error" in chunk:
        record.error = str(chunk["error"])
    if chunk.get("usage"):
        record.completion_tokens = chunk["usage"]["completion_tokens"]
    for choice in chunk.get("choices", []):
        delta = choice.get("delta") or {}
        audio = delta.get("audio") or {}
        # (with speech out, OpenAI streams the text as the audio's transcript)
        piece = delta.get("content") or audio.get("transcript")
        if piece:
            text += piece
            record.first_text = record.first_text or now
            record.text_times.append(now)
        if audio.get("data"):
            record.first_audio = record.first_audio or now
            record.audio_times.append(now)
            record.audio_seconds += len(base64.b64decode(audio["data"])) / PCM_BYTES_PER_SECOND
    return text


async def run_cell(
    cfg: BenchConfig,
    work: Workload,
    concurrency: int,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 5.0,
) -> tuple[list[RequestRecord], float]:
    """-> (measured records, wall seconds of the measured phase)."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=cfg.request_timeout_s, limits=limits) as http:
        gate = asyncio.Semaphore(concurrency)
        num_done = 0

        async def gated(seed: int, body: bytes) -> RequestRecord:
            nonlocal num_done
            async with gate:
                record = await one_request(http, cfg, work, concurrency, seed, body)
            num_done += 1
            return record

        warmup = [10_000 + i for i in range(cfg.warmup_waves * concurrency)]
        measured = list(range(max(cfg.min_requests, cfg.requests_per_concurrency * concurrency)))
        label, total = f"{work.path} B={concurrency}", len(warmup) + len(measured)
        ticker = None
        if progress is not None:
            progress(f"{label}: {total} requests ({len(warmup)} warm-up)")
            ticker = asyncio.create_task(_tick(progress, progress_every_s, lambda: f"{label}: {num_done}/{total}"))
        try:
            bodies = await asyncio.to_thread(encoded_bodies, work, cfg.model, warmup + measured)
            requests = list(zip(warmup + measured, bodies, strict=True))  # (seed, body)
            await asyncio.gather(*(gated(*request) for request in requests[: len(warmup)]))
            start = time.perf_counter()
            records = await asyncio.gather(*(gated(*request) for request in requests[len(warmup) :]))
            return list(records), time.perf_counter() - start
        finally:
            if ticker is not None:
                ticker.cancel()


async def _tick(progress: Callable[[str], None], every_s: float, status: Callable[[], str]) -> None:
    """``progress(status() + elapsed seconds)`` every ``every_s`` seconds until cancelled."""
    start = time.perf_counter()
    while True:
        await asyncio.sleep(every_s)
        progress(f"{status()} requests, {time.perf_counter() - start:.0f}s")
