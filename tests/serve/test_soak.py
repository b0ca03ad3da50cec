"""A mixed soak against a live server on the embedded tiny model (official ``openai`` client + raw
httpx): valid text / audio / image / video / speech requests, streams dropped mid-way, hostile
bodies, and clients hostile at the front door (headers sent a byte at a time, bodies cut short,
JSON sent as text/plain). Checks: no valid request lost, none hung, every hostile body a 4xx, every
slow client a 408 within the header timeout, no 500, the engine idle after.

CI runs a small soak (``test_soak``); the full one is a script:

    PYTHONPATH=$PWD python tests/serve/test_soak.py --requests 600 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the helpers package
from helpers.hostile import HOSTILE, RAW, rss_mb  # noqa: E402
from helpers.live_server import launch, png_data_url  # noqa: E402
from helpers.media_samples import encode_video, gradient_image  # noqa: E402
from helpers.qwen3_omni import AUDIO, IMAGE, wav_data_url  # noqa: E402

HANG_S = 600  # a request slower than this counts as hung
SPEECH = {"talker_temperature": 0.0, "min_audio_frames": 3, "max_audio_frames": 3}
VIDEO = (
    "data:video/mp4;base64,"
    + base64.b64encode(encode_video(np.stack([gradient_image(64, 64, seed=i) for i in range(4)]), 2)).decode()
)
HEADER_TIMEOUT_S = 5.0  # the soak server's --header-timeout-s and --body-timeout-s
REFUSED_SOURCES = ["http://127.0.0.1:1/a.png", "file:///etc/passwd", "/etc/passwd", "http://169.254.169.254/x"]


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "what is it?"}]}]


def _valid(kind: str, rng: random.Random) -> dict:
    n = rng.randint(2, 6)
    common = {"model": "qwen3-omni", "max_tokens": n, "extra_body": {"ignore_eos": True, **SPEECH}}
    if kind == "audio_in":
        b64 = wav_data_url(AUDIO).split(",", 1)[1]
        return {**common, "messages": _user({"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}})}
    if kind == "image_in":
        return {**common, "messages": _user({"type": "image_url", "image_url": {"url": png_data_url(IMAGE)}})}
    if kind == "video_in":
        return {**common, "messages": _user({"type": "video_url", "video_url": {"url": VIDEO}})}
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": f"tell me {rng.random()}"}]
    if kind in ("stream_speech", "dropped_stream"):
        return {
            **common,
            "messages": messages,
            "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "pcm16"},
            "stream": True,
        }
    return {**common, "messages": messages}


async def _chat(a: openai.AsyncOpenAI, kind: str, rng: random.Random) -> str:
    body = _valid(kind, rng)
    if not body.get("stream"):
        r = await a.chat.completions.create(**body)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == body["max_tokens"], r
        return "ok"
    stream = await a.chat.completions.create(**body)
    chunks, audio = 0, 0
    async for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            audio += bool(getattr(getattr(choice.delta, "audio", None), "data", None))
        if kind == "dropped_stream" and chunks == 2:
            await stream.close()  # the client hangs up mid-stream
            return "dropped"
    assert audio > 0, "a speech stream without audio"
    return "ok"


async def _speech(a: openai.AsyncOpenAI) -> str:
    r = await a.audio.speech.create(
        model="qwen3-omni", input="good morning", voice="ethan", response_format="wav", extra_body=SPEECH
    )
    assert r.content[:4] == b"RIFF"
    return "ok"


async def _hostile(h: httpx.AsyncClient, base: str, rng: random.Random) -> str:
    if rng.random() < 0.3:
        url = rng.choice(REFUSED_SOURCES)
        body = json.dumps({"messages": _user({"type": "image_url", "image_url": {"url": url}})}).encode()
    else:
        body, *_ = rng.choice(HOSTILE + RAW)
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = await h.post(f"{base}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500 and r.json()["error"]["type"] == "invalid_request_error", (r.status_code, r.text)
    return "refused"


async def _front_door(base: str, rng: random.Random) -> str:
    """A slowloris client (a 408 within the header timeout, then the close), a body cut short (the
    server counts a 499) or JSON as text/plain (a 415)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
    try:
        choice = rng.random()
        if choice < 0.4:
            start, answer = time.monotonic(), asyncio.create_task(reader.read())  # (until the server closes)
            for byte in head:  # (a byte a second: the deadline falls among them)
                if answer.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(1.0)
            answer = await asyncio.wait_for(answer, HEADER_TIMEOUT_S + 30)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
            assert time.monotonic() - start < HEADER_TIMEOUT_S + 30
            return "timed_out"
        if choice < 0.7:
            writer.write(head + b"Content-Type: application/json\r\n\r\n" + b'{"messages": [')
            await writer.drain()
            return "cut"  # (the close below: the client hangs up mid-body)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
        writer.write(head.replace(b"100", str(len(body)).encode()) + b"Content-Type: text/plain\r\n\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), HANG_S)
        assert answer.startswith(b"HTTP/1.1 415 "), answer[:100]
        return "refused"
    finally:
        writer.close()


# percent of the requests: a fifth of the streams are dropped, a fifth of all requests are hostile (a quarter
# of those at the front door)
MIX = [
    ("text", 22),
    ("stream_speech", 20),
    ("dropped_stream", 5),
    ("audio_in", 10),
    ("image_in", 10),
    ("video_in", 5),
    ("speech", 8),
    ("hostile", 15),
    ("front_door", 5),
]


async def soak(base: str, num_requests: int, concurrency: int, seed: int = 0) -> dict:
    kinds = [kind for kind, percent in MIX for _ in range(round(num_requests * percent / 100))]
    random.Random(seed).shuffle(kinds)
    gate, outcomes, failures = asyncio.Semaphore(concurrency), Counter(), []
    a = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=HANG_S)
    async with httpx.AsyncClient(timeout=HANG_S) as h:

        async def one(i: int, kind: str) -> None:
            async with gate:
                r = random.Random(seed * 100_003 + i)
                call = {"hostile": lambda: _hostile(h, base, r), "speech": lambda: _speech(a)}.get(kind)
                call = (lambda: _front_door(base, r)) if kind == "front_door" else call
                call = call() if call else _chat(a, kind, r)
                try:
                    outcomes[await asyncio.wait_for(call, HANG_S)] += 1
                except TimeoutError:
                    outcomes["hung"] += 1
                except Exception as e:  # noqa: BLE001 - counted and reported
                    outcomes["lost"] += 1
                    failures.append(f"{kind}: {type(e).__name__}: {e}"[:300])

        start = time.monotonic()
        await asyncio.gather(*(one(i, k) for i, k in enumerate(kinds)))
        wall = time.monotonic() - start
    return {"kinds": Counter(kinds), "outcomes": outcomes, "failures": failures, "wall_s": wall}


async def idle_metrics(base: str, timeout: float = 60) -> dict[str, float]:
    """The engine's and the server's levels once everything has drained (or the timeout)."""
    wanted = {
        'omniwalk_engine{quantity="requests",replica="0",stage="engine"}': 0.0,
        'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="thinker"}': 0.0,
        'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="talker"}': 0.0,
        "omniwalk_requests_in_flight": 0.0,
        "omniwalk_media_queue_depth": 0.0,
    }
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as h:
        while True:
            text = (await h.get(f"{base}/metrics")).text
            values = {
                k: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                for k in wanted
                if line.startswith(k + " ")
            }
            if values == wanted or time.monotonic() > deadline:
                return values
            await asyncio.sleep(0.5)


def run_soak(num_requests: int, concurrency: int) -> dict:
    timeouts = ("--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(HEADER_TIMEOUT_S))
    proc, base = launch("--max-requests", "512", *timeouts)
    try:
        before = rss_mb(proc.pid)
        result = asyncio.run(soak(base, num_requests, concurrency))
        result["idle"] = asyncio.run(idle_metrics(base))
        lines = httpx.get(f"{base}/metrics").text.splitlines()
        result["http_500"] = sum(float(x.rsplit(" ", 1)[1]) for x in lines if 'status="500"' in x and x[0] != "#")
        result["rss_mb"] = (before, rss_mb(proc.pid))
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def check(result: dict) -> None:
    outcomes, kinds = result["outcomes"], result["kinds"]
    assert outcomes["lost"] == 0 and outcomes["hung"] == 0, result["failures"]
    assert outcomes["refused"] + outcomes["timed_out"] + outcomes["cut"] == kinds["hostile"] + kinds["front_door"]
    assert result["http_500"] == 0, "a 500 in the soak"
    assert outcomes["dropped"] == kinds["dropped_stream"]
    assert set(result["idle"].values()) == {0.0}, result["idle"]


def test_soak():
    result = run_soak(120, 32)
    print(report(result))
    check(result)


def report(result: dict) -> str:
    before, after = result["rss_mb"]
    return (
        f"{sum(result['kinds'].values())} requests in {result['wall_s']:.1f} s; kinds {dict(result['kinds'])}; "
        f"outcomes {dict(result['outcomes'])}; idle after: {result['idle']}; "
        f"HTTP process RSS {before:.0f} -> {after:.0f} MB ({after - before:+.0f} MB)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    outcome = run_soak(args.requests, args.concurrency)
    print(report(outcome))
    for failure in outcome["failures"]:
        print("  ", failure)
    check(outcome)
