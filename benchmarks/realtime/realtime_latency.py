"""First audio after the end of user speech over /v1/realtime, server VAD included, at N sessions.

    PYTHONPATH=$PWD python benchmarks/realtime/realtime_latency.py --base-url http://127.0.0.1:8000/v1 \
        --sessions 1,16 --turns 5 --out results/realtime_latency.json

Each session is a microphone: PCM16 at 24 kHz in 100 ms chunks, paced in real time, quiet (noise
at -54 dBFS) except for ``--speech-s`` of speech-like audio per turn; it keeps streaming quiet
while the answer comes (as a live microphone does). Per turn, from the moment the last chunk
holding speech was sent: ``vad_ms`` to ``input_audio_buffer.speech_stopped`` (the silence the
VAD waits for, ``--silence-ms``, is part of it) and ``first_audio_ms`` to the first
``response.output_audio.delta``. Answers are bounded (``--max-tokens``, ``--audio-frames``) so
that random weights, which never stop by themselves, give turns of equal work.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time
from pathlib import Path

import numpy as np
import openai

from omniwalk.bench.workload import speech_like

RATE, CHUNK_S = 24000, 0.1


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


class Microphone:
    """Paced 100 ms chunks: quiet unless a turn's speech is queued."""

    def __init__(self, conn, seed: int):
        self.conn, self.rng, self.seed = conn, np.random.default_rng(seed), seed
        self.speech: list[bytes] = []
        self.speech_sent_at: float | None = None

    def say(self, seconds: float, turn: int) -> None:
        audio = pcm16(speech_like(seconds, self.seed * 1000 + turn, RATE))
        step = int(RATE * CHUNK_S) * 2
        self.speech = [audio[i : i + step] for i in range(0, len(audio), step)]

    async def run(self) -> None:
        start, n = time.monotonic(), 0
        while True:
            chunk = self.speech.pop(0) if self.speech else pcm16(0.002 * self.rng.standard_normal(int(RATE * CHUNK_S)))
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            if self.speech == [] and self.speech_sent_at is None:
                self.speech_sent_at = time.monotonic()
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_S - time.monotonic()))


async def session(client, args, index: int, records: list) -> None:
    async with client.realtime.connect(model=args.model) as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": args.silence_ms}},
                    "output": {"voice": args.voice},
                },
                "max_output_tokens": args.max_tokens,
                "ignore_eos": True,
                "min_audio_frames": args.audio_frames,
                "max_audio_frames": args.audio_frames,
            }
        )
        mic = Microphone(conn, index)
        mic.speech_sent_at = 0.0  # (no speech queued yet)
        streaming = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(0.5 + 0.05 * index)  # quiet first; sessions out of phase
            for turn in range(args.turns):
                mic.speech_sent_at = None
                mic.say(args.speech_s, turn)
                stopped = audio = None
                async for event in conn:
                    if event.type == "input_audio_buffer.speech_stopped" and stopped is None:
                        stopped = time.monotonic()
                    elif event.type == "response.output_audio.delta" and audio is None:
                        audio = time.monotonic()
                    elif event.type == "error":
                        raise RuntimeError(event.error.message)
                    elif event.type == "response.done":
                        break
                end = mic.speech_sent_at
                records.append(
                    {
                        "session": index,
                        "turn": turn,
                        "vad_ms": 1000 * (stopped - end),
                        "first_audio_ms": 1000 * (audio - end),
                        "status": event.response.status,
                    }
                )
                await asyncio.sleep(0.3)
        finally:
            streaming.cancel()


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"mean": statistics.fmean(values), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--model", default="qwen3-omni")
    parser.add_argument("--voice", default="ethan")
    parser.add_argument("--sessions", default="1,16")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--speech-s", type=float, default=2.0)
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--audio-frames", type=int, default=25)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    results = {}
    for n in (int(x) for x in args.sessions.split(",")):
        records: list = []
        await asyncio.gather(*(session(client, args, i, records) for i in range(n)))
        cell = {key: summary([r[key] for r in records]) for key in ("vad_ms", "first_audio_ms")}
        results[n] = {**cell, "turns": len(records), "records": records}
        print(
            f"{n} sessions, {len(records)} turns: VAD stop {cell['vad_ms']['p50']:.0f} ms (p50), first audio "
            f"{cell['first_audio_ms']['p50']:.0f} ms p50 / {cell['first_audio_ms']['p90']:.0f} ms p90 after the end "
            f"of speech",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
