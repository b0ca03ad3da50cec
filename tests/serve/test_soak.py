"""A mixed soak against a live server on the embedded tiny model (official ``openai`` client + raw
httpx + websockets): valid text / audio / image / video / speech requests, streams dropped mid-way,
hostile bodies, clients hostile at the front door (headers sent a byte at a time, bodies cut short,
JSON sent as text/plain), media bombs (a few KB that decode to gigabytes), long videos whose
clients hang up while they decode, and realtime sessions flooding their conversations with audio.
Checks: no valid request lost, none hung, every hostile body a 4xx, every bomb a 400 naming its
limit, every slow client a 408 within the header timeout, every abandoned video's decoding
cancelled, every flood within its conversation's bound (the rest refused by the server's audio
budget), no 500, the HTTP process's peak memory bounded, the engine and media pool idle after.

CI runs a small soak (``test_soak``); the full one is a script:

    PYTHONPATH=$PWD python tests/serve/test_soak.py --requests 600 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import openai
import websockets

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the helpers package
from helpers.live_server import HOSTILE, RAW, launch, media_body, media_bombs, metric, png_data_url, rss_mb, slow_video  # noqa: E402  # noqa: E402
from helpers.media_samples import encode_video, gradient_image  # noqa: E402
from helpers.qwen3_omni import AUDIO, IMAGE, wav_data_url  # noqa: E402

HANG_S = 600  # a request slower than this counts as hung
SPEECH = {"talker_temperature": 0.0, "min_audio_frames": 3, "max_audio_frames": 3}


@functools.cache
def video_url() -> str:
    """A small valid video (made on first use: the GPU machine, which collects this module, has no PyAV)."""
    frames = np.stack([gradient_image(64, 64, seed=i) for i in range(4)])
    return "data:video/mp4;base64," + base64.b64encode(encode_video(frames, 2)).decode()


HEADER_TIMEOUT_S = 5.0  # the soak server's --header-timeout-s and --body-timeout-s
# the soak server's realtime bounds: a conversation holds one flood item (the next replaces it), and so do all
# sessions together (an item of a session beside the one holding it is refused: server_audio_budget_exceeded)
FLOOD_ITEM_BYTES = 4 * 2**20  # PCM16 (87 s at 24 kHz): the default --realtime-max-append-bytes
NUM_FLOOD_ITEMS, FLOOD_ITEMS_HELD = 5, 1
REALTIME_FLAGS = ("--realtime-max-conversation-audio-s", "90", "--realtime-max-total-audio-bytes", "4MiB")
ABANDON_AFTER_S = 0.3  # a long video's client hangs up this long after sending it
# the HTTP process's peak RSS over the soak, above its RSS before: the realtime budget (4 MiB), the media
# arrays of two workers and of requests waiting for the engine, bodies in flight, and allocator slack
MAX_PEAK_GROWTH_MB = 250
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
        return {**common, "messages": _user({"type": "video_url", "video_url": {"url": video_url()}})}
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


async def _media_bomb(h: httpx.AsyncClient, base: str, bombs: list, rng: random.Random) -> str:
    body, limit = rng.choice(bombs)
    r = await h.post(f"{base}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and limit in r.json()["error"]["message"], (r.status_code, r.text[:300])
    return "refused"


async def _abandoned_media(base: str, body: bytes) -> str:
    """A long video posted on a raw connection, hung up on while it decodes (or waits for a worker):
    its decoding is cancelled (``omniwalk_media_cancelled_total{kind="video"}``) and it is counted 499."""
    host, port = base.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await asyncio.sleep(ABANDON_AFTER_S)
    writer.close()
    return "abandoned"


async def _realtime_flood(base: str, frame: str, seen: Counter) -> str:
    """A realtime session sending ``NUM_FLOOD_ITEMS`` creates of one 4 MiB audio item, then a second
    session sending one: each is added (past ``FLOOD_ITEMS_HELD`` the oldest dropped first) or refused
    with an ``error`` event because the sessions hold the server's audio budget (one item); the first
    session answers after it all. ``seen`` counts the items added, deleted and refused: across the soak
    both bounds are met (the first session to hold an item replaces it, the second sessions are refused)."""
    url = base.replace("http", "ws", 1) + "/v1/realtime"
    async with websockets.connect(url, max_size=2**20, compression=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        held: list[str] = []
        for _ in range(NUM_FLOOD_ITEMS):
            await _create(ws, frame, held, seen)
        async with websockets.connect(url, max_size=2**20, compression=None) as beside:
            assert json.loads(await beside.recv())["type"] == "session.created"
            await _create(beside, frame, [], seen)
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"
    return "flooded"


async def _create(ws, frame: str, held: list[str], seen: Counter) -> None:
    """Send one ``conversation.item.create``; follow ``held`` (the session's items) through its events."""
    await ws.send(frame)
    while (event := json.loads(await ws.recv()))["type"] not in ("conversation.item.done", "error"):
        if event["type"] == "conversation.item.deleted":
            held.remove(event["item_id"])
            seen["deleted"] += 1
        elif event["type"] == "conversation.item.added":
            held.append(event["item"]["id"])
            seen["added"] += 1
    if event["type"] == "error":
        assert event["error"]["code"] == "server_audio_budget_exceeded", event
        seen["refused"] += 1
    assert len(held) <= FLOOD_ITEMS_HELD, held


def hostile_payloads() -> dict:
    """The bombs' bodies (with the limit each 400 names), a long video's body, a flood item's event:
    made before the soak (seconds of encoding that would stall its event loop)."""
    bombs = [(json.dumps(media_body(kind, mime, data)).encode(), limit) for kind, mime, data, limit in media_bombs(120)]
    pcm = np.random.default_rng(0).integers(-3000, 3000, FLOOD_ITEM_BYTES // 2, dtype=np.int16).tobytes()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}],
    }
    return {
        "bombs": bombs,
        "slow_video": json.dumps(media_body("video", "video/mp4", slow_video())).encode(),
        "flood": json.dumps({"type": "conversation.item.create", "item": item}),
    }


# percent of the requests: a fifth of the streams are dropped, a quarter of all requests are hostile (a fifth
# of those at the front door, a sixth media bombs), a few abandon long videos or flood a realtime session
MIX = [
    ("text", 14),
    ("stream_speech", 18),
    ("dropped_stream", 5),
    ("audio_in", 10),
    ("image_in", 10),
    ("video_in", 5),
    ("speech", 8),
    ("hostile", 15),
    ("front_door", 5),
    ("media_bomb", 4),
    ("abandoned_media", 3),
    ("realtime_flood", 3),
]


async def soak(base: str, num_requests: int, concurrency: int, payloads: dict, seed: int = 0) -> dict:
    kinds = [kind for kind, percent in MIX for _ in range(round(num_requests * percent / 100))]
    random.Random(seed).shuffle(kinds)
    gate, outcomes, failures, flood = asyncio.Semaphore(concurrency), Counter(), [], Counter()
    a = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=HANG_S)
    async with httpx.AsyncClient(timeout=HANG_S) as h:

        async def one(i: int, kind: str) -> None:
            async with gate:
                r = random.Random(seed * 100_003 + i)
                calls = {
                    "hostile": lambda: _hostile(h, base, r),
                    "speech": lambda: _speech(a),
                    "front_door": lambda: _front_door(base, r),
                    "media_bomb": lambda: _media_bomb(h, base, payloads["bombs"], r),
                    "abandoned_media": lambda: _abandoned_media(base, payloads["slow_video"]),
                    "realtime_flood": lambda: _realtime_flood(base, payloads["flood"], flood),
                }
                call = calls[kind]() if kind in calls else _chat(a, kind, r)
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
    return {"kinds": Counter(kinds), "outcomes": outcomes, "failures": failures, "wall_s": wall, "flood": flood}


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
    payloads = hostile_payloads()
    proc, base = launch("--max-requests", "512", *timeouts, *REALTIME_FLAGS)
    try:
        before = rss_mb(proc.pid)
        cancelled = metric(base, "omniwalk_media_cancelled_total", kind="video")
        decoded = metric(base, "omniwalk_media_decode_seconds_count", kind="video")
        result = asyncio.run(soak(base, num_requests, concurrency, payloads))
        result["idle"] = asyncio.run(idle_metrics(base))
        lines = httpx.get(f"{base}/metrics").text.splitlines()
        result["http_500"] = sum(float(x.rsplit(" ", 1)[1]) for x in lines if 'status="500"' in x and x[0] != "#")
        result["videos_cancelled"] = metric(base, "omniwalk_media_cancelled_total", kind="video") - cancelled
        result["videos_decoded"] = metric(base, "omniwalk_media_decode_seconds_count", kind="video") - decoded
        result["rss_mb"] = (before, rss_mb(proc.pid), peak_rss_mb(proc.pid))
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def peak_rss_mb(pid: int) -> float:
    line = next(line for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def check(result: dict) -> None:
    outcomes, kinds = result["outcomes"], result["kinds"]
    assert outcomes["lost"] == 0 and outcomes["hung"] == 0, result["failures"]
    refused = kinds["hostile"] + kinds["front_door"] + kinds["media_bomb"]
    assert outcomes["refused"] + outcomes["timed_out"] + outcomes["cut"] == refused
    assert result["http_500"] == 0, "a 500 in the soak"
    assert outcomes["dropped"] == kinds["dropped_stream"]
    # an abandoned video's decoding is stopped (counted cancelled) or never starts (its request ended first, as a
    # loaded server may take longer than the client waits to reach it): none is decoded, only video_in's are
    assert outcomes["abandoned"] == kinds["abandoned_media"] >= result["videos_cancelled"]
    assert result["videos_decoded"] == kinds["video_in"], (result["videos_decoded"], kinds["video_in"])
    assert outcomes["flooded"] == kinds["realtime_flood"]
    assert result["flood"]["deleted"] > 0 and result["flood"]["refused"] > 0, result["flood"]  # both bounds met
    assert set(result["idle"].values()) == {0.0}, result["idle"]
    before, _, peak = result["rss_mb"]
    assert peak - before < MAX_PEAK_GROWTH_MB


def test_soak():
    result = run_soak(120, 32)
    print(report(result))
    check(result)


def report(result: dict) -> str:
    before, after, peak = result["rss_mb"]
    return (
        f"{sum(result['kinds'].values())} requests in {result['wall_s']:.1f} s; kinds {dict(result['kinds'])}; "
        f"outcomes {dict(result['outcomes'])}; videos cancelled {result['videos_cancelled']:.0f}, decoded "
        f"{result['videos_decoded']:.0f}; "
        f"realtime flood items {dict(result['flood'])}; "
        f"idle after: {result['idle']}; HTTP process RSS {before:.0f} -> {after:.0f} MB ({after - before:+.0f} MB), "
        f"peak {peak:.0f} MB ({peak - before:+.0f} MB)"
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
