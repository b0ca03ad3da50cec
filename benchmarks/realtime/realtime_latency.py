"""The realtime load generator: N sessions of spoken turns over /v1/realtime, server VAD included.

    PYTHONPATH=$PWD python benchmarks/realtime/realtime_latency.py --base-url http://127.0.0.1:8000/v1 \
        --sessions 1,16,64 --turns 5 --server-pid PID --out results/realtime_latency.json

Each session is a microphone: PCM16 at 24 kHz in 100 ms chunks, paced in real time, quiet (noise
at -54 dBFS) except for its turns, real speech by espeak-ng (``speech_turns.py``) with a pause of
``--pause-s`` inside each (longer than a tentative end of speech, shorter than the confirming
silence); it keeps streaming quiet while the answer comes (as a live microphone does). Per turn,
from the moment the last chunk holding speech was sent: ``vad_ms`` to
``input_audio_buffer.speech_stopped`` (the silence the VAD waits for, ``--silence-ms``, is part of
it), ``first_audio_ms`` to the first ``response.output_audio.delta``, ``answer_ms`` between the two
(the server's share), the answer's playback ``underruns`` (``load_stats.py``) and the seconds of its audio out
before each (``underrun_at_s``), and whether the VAD
split the turn at its pause (an answer came before the turn was said: ``split``). Per cell (a
session count): discarded preemptive answers (the server's /metrics, where it counts them), omniwalk's engine
counters (recordings encoded and skipped under prefix pages, prefix tokens taken, KV preemptions), the mean
time a request waited for the engine's step loop and its processing took in it (``inbox_ms_mean``,
``add_ms_mean``: omniwalk's first-output phases), the mean time from a request entering the engine to its
first work in each stage (``stage_start_ms_mean``: where an answer's first audio waits), per turn the
answers' median share and mean prompt tokens, all and computed (``prompt_tokens_by_turn``, "all:computed":
the rest came from prefix pages) and, with ``--server-pid``, the HTTP process's CPU per session. Answers are
bounded (``--max-tokens``; ``--audio-frames``, 0 = the server's speech cap) so that random weights give turns of
equal work. One session's ``--warmup-turns`` go first, unmeasured. Writes ``--out`` (JSON) and the table
beside it (.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import openai

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # benchmarks/
from harness import markdown_table  # noqa: E402
from load_stats import (  # noqa: E402
    cpu_seconds,
    discarded_preemptions,
    engine_counts,
    histogram_totals,
    metrics_text,
    summary,
    underruns,
)
from speech_turns import RATE, quiet, source, turn  # noqa: E402

CHUNK_S = 0.1
COLUMNS = ["sessions", "turns", "vad_p50_ms", "first_audio_p50_ms", "first_audio_p90_ms", "answer_p50_ms"]
COLUMNS += ["underruns_per_answer", "answers_underrun", "split_turns", "discarded_preemptions"]
COLUMNS += ["error_turns", "http_cpu_pct_per_session", "inbox_ms_mean", "add_ms_mean", "audio_items_encoded_skipped"]
COLUMNS += ["stage_start_ms_mean", "answer_p50_ms_by_turn", "prompt_tokens_by_turn"]


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


class Microphone:
    """Paced 100 ms chunks: quiet unless a turn's speech is queued."""

    def __init__(self, conn, seed: int):
        self.conn, self.rng = conn, np.random.default_rng(seed)
        self.speech: list[bytes] = []
        self.speech_sent_at: float | None = 0.0  # (no speech queued yet)

    def say(self, audio: np.ndarray) -> None:
        """Queue ``audio``, its last chunk completed with quiet (a microphone's chunks are all whole: a short
        one, paced as a whole one, would put the stream behind the clock)."""
        if rest := -len(audio) % int(RATE * CHUNK_S):
            audio = np.concatenate([audio, quiet(CHUNK_S, self.rng)[:rest]])
        data, step = pcm16(audio), int(RATE * CHUNK_S) * 2
        self.speech_sent_at = None
        self.speech = [data[i : i + step] for i in range(0, len(data), step)]

    async def run(self) -> None:
        start, n = time.monotonic(), 0
        while True:
            chunk = self.speech.pop(0) if self.speech else pcm16(quiet(CHUNK_S, self.rng))
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            if self.speech == [] and self.speech_sent_at is None:
                self.speech_sent_at = time.monotonic()
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_S - time.monotonic()))


def session_settings(args) -> dict:
    detection = {"type": "server_vad", "silence_duration_ms": args.silence_ms, **json.loads(args.turn_detection)}
    frames = {"min_audio_frames": args.audio_frames, "max_audio_frames": args.audio_frames} if args.audio_frames else {}
    return {
        "type": "realtime",
        "audio": {"input": {"turn_detection": detection}, "output": {"voice": args.voice}},
        "max_output_tokens": args.max_tokens,
        "ignore_eos": True,
        **frames,
    }


async def answer(conn, mic: Microphone) -> tuple[float | None, list[tuple[float, int]], str, int, object]:
    """Events up to the ``response.done`` of the answer to the turn being said -> (when its speech_stopped
    came, its audio chunks (arrival, bytes), its status, answers to part of the turn: ended while it was
    still being said, or cancelled by the rest of it (the VAD split the turn at its pause), its usage). An
    ``error`` event ends the turn with status "error: MESSAGE" (counted per cell; the session goes on)."""
    stopped, chunks, splits = None, [], 0
    async for event in conn:
        if event.type == "input_audio_buffer.speech_stopped":
            stopped = time.monotonic()
        elif event.type == "response.output_audio.delta":
            chunks.append((time.monotonic(), len(base64.b64decode(event.delta))))
        elif event.type == "error":
            return stopped, [], f"error: {event.error.message}", splits, None
        elif event.type == "response.done" and (mic.speech_sent_at is None or event.response.status == "cancelled"):
            stopped, chunks, splits = None, [], splits + 1  # (an answer to half the turn, or one cut by its rest)
        elif event.type == "response.done":
            return stopped, chunks, event.response.status, splits, event.response.usage
    raise RuntimeError("the session closed mid-answer")


def prompt_tokens(usage) -> tuple[int | None, int | None]:
    """A ``response.done`` usage -> (the answer's prompt tokens, those taken from prefix pages): a prompt
    that grows from turn to turn while its cached part keeps up costs the same prefill each turn."""
    if usage is None or usage.input_tokens is None:
        return None, None
    details = usage.input_token_details
    return usage.input_tokens, details.cached_tokens if details is not None else None


async def session(client, args, index: int, records: list) -> None:
    async with client.realtime.connect(model=args.model) as conn:
        await conn.session.update(session=session_settings(args))
        mic = Microphone(conn, index)
        streaming = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(0.5 + 0.05 * index)  # quiet first; sessions out of phase
            for number in range(args.turns):
                mic.say(turn(index + number, args.pause_s, mic.rng))
                stopped, chunks, status, splits, usage = await answer(conn, mic)
                end = mic.speech_sent_at
                first = chunks[0][0] if chunks else None
                prompt, cached = prompt_tokens(usage)
                records.append(
                    {
                        "session": index,
                        "turn": number,
                        "vad_ms": 1000 * (stopped - end) if stopped else None,
                        "first_audio_ms": 1000 * (first - end) if first else None,
                        "answer_ms": 1000 * (first - stopped) if first and stopped else None,
                        "audio_s": sum(size for _, size in chunks) / 2 / RATE,
                        "underruns": len(gaps := underruns(chunks)),
                        "underrun_at_s": [round(at, 3) for at in gaps],
                        "split": splits,
                        "status": status,
                        "prompt_tokens": prompt,
                        "cached_tokens": cached,
                    }
                )
                await asyncio.sleep(0.3)
        finally:
            streaming.cancel()


async def cell(client, args, n: int) -> dict:
    """``n`` sessions of ``args.turns`` turns -> the cell's summaries and its records."""
    records: list = []
    metrics = metrics_text(args.base_url, args.api_key)
    cpu, start = cpu_seconds(args.server_pid) if args.server_pid else None, time.monotonic()
    await asyncio.gather(*(session(client, args, i, records) for i in range(n)))
    wall = time.monotonic() - start
    metrics_after = metrics_text(args.base_url, args.api_key)
    discarded, after = discarded_preemptions(metrics), discarded_preemptions(metrics_after)
    engine, engine_after = engine_counts(metrics), engine_counts(metrics_after)
    phases_of = functools.partial(histogram_totals, metric="omniwalk_first_output_phase_seconds", label="phase")
    stages_of = functools.partial(histogram_totals, metric="omniwalk_stage_start_seconds", label="stage")
    phases, phases_after = phases_of(metrics), phases_of(metrics_after)
    stages, stages_after = stages_of(metrics), stages_of(metrics_after)
    stats = {key: summary([r[key] for r in records if r[key] is not None]) for key in ("vad_ms", "first_audio_ms")}
    stats["answer_ms"] = summary([r["answer_ms"] for r in records if r["answer_ms"] is not None])
    counts = [r["underruns"] for r in records]
    answers = [(r["turn"], r["answer_ms"]) for r in records if r["answer_ms"] is not None]
    by_turn = [[ms for turn, ms in answers if turn == t] for t in range(args.turns)]
    prompts = [
        [(r["prompt_tokens"], r["cached_tokens"] or 0) for r in records if r["turn"] == t] for t in range(args.turns)
    ]
    prompts = [[pair for pair in pairs if pair[0] is not None] for pairs in prompts]
    return {
        **stats,
        "turns": len(records),
        "underruns_per_answer": sum(counts) / len(counts),
        "answers_underrun": sum(c > 0 for c in counts),
        "split_turns": sum(r["split"] > 0 for r in records),
        "error_turns": sum(r["status"].startswith("error") for r in records),
        "discarded_preemptions": None if after is None else after - (discarded or 0),
        "http_cpu_pct_per_session": None if cpu is None else 100 * (cpu_seconds(args.server_pid) - cpu) / wall / n,
        # (omniwalk: media items encoded and skipped, prefix tokens taken, KV preemptions, during the cell)
        "engine": {key: engine_after[key] - engine.get(key, 0.0) for key in engine_after},
        # (omniwalk: mean ms a request waited for the engine's step loop, and its processing took in that loop)
        **{f"{phase}_ms_mean": _mean_ms(phases, phases_after, phase) for phase in ("inbox", "add")},
        # (omniwalk: mean ms from a request entering the engine to its first work in each stage, answers and
        # transcriptions together: where an answer's first audio waits)
        "stage_start_ms_mean": {name: _mean_ms(stages, stages_after, name) for name in stages_after},
        # (a median that grows from turn to turn: the server falls behind the sessions' turns)
        "answer_p50_ms_by_turn": [summary(values).get("p50") for values in by_turn],
        # (mean prompt tokens of each turn's answers and the mean of those the thinker computed, the rest
        # taken from prefix pages: what an answer's prefill costs as the conversation grows)
        "prompt_tokens_by_turn": [
            [float(np.mean([p for p, _ in pairs])), float(np.mean([p - c for p, c in pairs]))] if pairs else None
            for pairs in prompts
        ],
        "records": records,
    }


def _mean_ms(before: dict, after: dict, key: str) -> float | None:
    """The mean ms of a histogram's observations of ``key`` between two ``histogram_totals`` (None: none)."""
    seconds, count = after.get(key, (0.0, 0.0))
    seconds, count = seconds - before.get(key, (0.0, 0.0))[0], count - before.get(key, (0.0, 0.0))[1]
    return 1e3 * seconds / count if count else None


def table(results: dict) -> str:
    rows = []
    for n, c in results.items():
        picks = [c["vad_ms"].get("p50"), c["first_audio_ms"].get("p50"), c["first_audio_ms"].get("p90")]
        by_turn = " / ".join("-" if v is None else f"{v:.0f}" for v in c["answer_p50_ms_by_turn"])
        engine, items = c["engine"], None
        if engine:
            items = f"{engine['audio_encoder_items_encoded']:.0f} / {engine['audio_encoder_items_skipped']:.0f}"
        starts = " / ".join(f"{name} {ms:.0f}" for name, ms in c["stage_start_ms_mean"].items() if ms is not None)
        prompts = " / ".join("-" if v is None else f"{v[0]:.0f}:{v[1]:.0f}" for v in c["prompt_tokens_by_turn"])
        counts = [c[k] for k in COLUMNS[6:-4]]
        rows.append([n, c["turns"], *picks, c["answer_ms"].get("p50"), *counts, items, starts, by_turn, prompts])
    return markdown_table(COLUMNS, rows)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", default="qwen3-omni")
    p.add_argument("--voice", default="ethan")
    p.add_argument("--sessions", default="1,16")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--warmup-turns", type=int, default=1, help="turns of one session before the cells, unmeasured")
    p.add_argument("--pause-s", type=float, default=0.25, help="quiet inside each turn (0: none)")
    p.add_argument("--silence-ms", type=int, default=500)
    p.add_argument("--turn-detection", default="{}", help="JSON merged into turn_detection (e.g. preemption)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--audio-frames", type=int, default=25, help="frames per answer; 0: the server's speech cap")
    p.add_argument("--server-pid", type=int, help="the HTTP server's process id: its CPU time per session")
    p.add_argument("--out", type=Path, default=None, help="JSON file; the table goes beside it (.md)")
    return p.parse_args()


async def main() -> None:
    args = parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    if args.warmup_turns:  # (unmeasured: a server's first answers meet paths not yet warm)
        await session(client, argparse.Namespace(**{**vars(args), "turns": args.warmup_turns}), 0, [])
    results = {}
    for n in (int(x) for x in args.sessions.split(",")):
        results[n] = c = await cell(client, args, n)
        print(
            f"{n} sessions, {c['turns']} turns: VAD stop {c['vad_ms'].get('p50', float('nan')):.0f} ms (p50), first "
            f"audio {c['first_audio_ms'].get('p50', float('nan')):.0f} ms p50 / "
            f"{c['first_audio_ms'].get('p90', float('nan')):.0f} ms p90 after the end of speech; "
            f"{c['underruns_per_answer']:.2f} underruns per answer",
            flush=True,
        )
    print(table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = vars(args) | {"out": str(args.out), "speech": source()}
        args.out.write_text(json.dumps({"args": settings, "results": results}, indent=1))
        args.out.with_suffix(".md").write_text(f"speech: {source()}; args: {settings}\n\n{table(results)}\n")


if __name__ == "__main__":
    asyncio.run(main())
