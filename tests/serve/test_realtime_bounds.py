"""/v1/realtime under hostile load, against a live `omniwalk serve` (tiny model), with a raw
websockets client: a flood of 8 MiB audio items stays within the conversation bounds and the
server's audio budget (the HTTP process's own RSS), a response on a too-large conversation is
refused before its prompt is built, idle and over-long sessions are closed, and a client that goes
away while its response's audio is decoded stops that decoding.

One server for the module, with small bounds: a conversation holds 600 s of audio (three 8 MiB
items), all sessions 36 MiB (four items), a prompt at most 16 MiB; idle after 2 s, sessions of 30 s;
one media worker (so a long video holds it).
"""

import asyncio
import base64
import json
import time

import numpy as np
import pytest
import websockets
from helpers.live_server import launch, media_body, metric, rss_mb, slow_video

ITEM_BYTES = 8 * 2**20  # PCM16 per item: 174.8 s at 24 kHz
IDLE_S, SESSION_S = 2.0, 30.0  # (the flood's first session lives through it)
FLAGS = {
    "--realtime-max-append-bytes": "8MiB",
    "--realtime-max-conversation-audio-s": "600",
    "--realtime-max-total-audio-bytes": "36MiB",
    "--max-body-bytes": "16MiB",
    "--realtime-idle-timeout-s": str(IDLE_S),
    "--realtime-max-session-s": str(SESSION_S),
    "--media-workers": "1",
}


@pytest.fixture(scope="module")
def served():
    proc, base = launch(*(x for flag in FLAGS.items() for x in flag))
    try:
        yield proc, base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def connect(base: str):
    url = base.replace("http", "ws", 1) + "/v1/realtime"
    ws = await websockets.connect(url, max_size=2**20, compression=None)  # (deflating 11 MB frames: 5x slower)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def events_until(ws, done, timeout: float = 60) -> list[dict]:
    """Server events up to and including the first for which ``done(event)`` holds."""
    events = []
    while not events or not done(events[-1]):
        events.append(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
    return events


def audio_item(seed: int) -> str:
    pcm = np.random.default_rng(seed).integers(-3000, 3000, ITEM_BYTES // 2, dtype=np.int16).tobytes()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}],
    }
    return json.dumps({"type": "conversation.item.create", "event_id": f"ev{seed}", "item": item})


async def flood(ws, frame: str, count: int) -> list[dict]:
    """Send ``count`` creates of one item (each with its own id) -> the events each one caused."""
    events = []
    for i in range(count):
        await ws.send(frame.replace('"type": "message"', f'"id": "item_{id(ws)}_{i}", "type": "message"', 1))
        events += await events_until(ws, lambda e: e["type"] in ("conversation.item.done", "error"))
    return events


async def keep_alive(ws) -> None:
    while True:
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await asyncio.sleep(IDLE_S / 4)


def test_an_item_flood_stays_within_the_bounds_and_a_huge_prompt_is_refused(served):
    proc, base = served
    frame = audio_item(0)
    before = rss_mb(proc.pid)

    async def run():
        first = await connect(base)
        kept = await flood(first, frame, 30)  # one conversation: its oldest items leave
        await first.send(json.dumps({"type": "response.create"}))
        too_large = await events_until(first, lambda e: e["type"] in ("error", "response.created"))
        alive = asyncio.create_task(keep_alive(first))  # (an idle session is closed: its audio would leave)
        second = await connect(base)
        refused = await flood(second, frame, 30)  # the server's budget: 36 MiB, 24 MiB held already
        alive.cancel()
        await asyncio.gather(alive, return_exceptions=True)
        peak = rss_mb(proc.pid)
        await first.close()
        await second.close()
        return kept, refused, too_large[-1], peak

    kept, refused, too_large, peak = asyncio.run(run())
    growth = peak - before
    print(f"HTTP process RSS growth over 60 creates of 8 MiB PCM and a response.create: {growth:.0f} MB")
    deleted = [e["item_id"] for e in kept if e["type"] == "conversation.item.deleted"]
    added = [e["item"]["id"] for e in kept if e["type"] == "conversation.item.done"]
    assert len(added) == 30 and deleted == added[:27]  # three items of 8 MiB fit in 600 s
    assert not [e for e in kept if e["type"] == "error"]
    errors = [e["error"] for e in refused if e["type"] == "error"]
    assert len(errors) == 29 and {e["code"] for e in errors} == {"server_audio_budget_exceeded"}
    assert errors[0]["event_id"] == "ev0"
    assert too_large["type"] == "error" and too_large["error"]["code"] == "conversation_too_large"
    assert growth < 38 + 150  # the budget's 36 MiB (as MB: 38) + transient frames, decoding and allocator slack


def test_a_session_without_client_events_is_closed_as_idle(served):
    _, base = served

    async def run():
        start = time.monotonic()  # (before the handshake, where the server's idle clock starts)
        ws = await connect(base)
        event = json.loads(await asyncio.wait_for(ws.recv(), 10 * IDLE_S))
        await asyncio.wait_for(ws.wait_closed(), 10)
        return event, time.monotonic() - start, ws.close_code

    event, waited, code = asyncio.run(run())
    assert event["type"] == "error" and event["error"]["code"] == "idle_timeout" and code == 1000
    assert IDLE_S <= waited < 5 * IDLE_S


def test_a_busy_session_is_closed_at_its_lifetime(served):
    _, base = served

    async def run():
        ws = await connect(base)
        start, alive = time.monotonic(), asyncio.create_task(keep_alive(ws))  # never idle
        events = await events_until(ws, lambda e: e["type"] != "input_audio_buffer.cleared", SESSION_S + 10)
        lived = time.monotonic() - start
        await asyncio.wait_for(ws.wait_closed(), 10)
        await asyncio.gather(alive, return_exceptions=True)  # (it ends when the socket closes)
        return events[-1], lived, ws.close_code

    event, lived, code = asyncio.run(run())
    assert event["type"] == "error" and event["error"]["code"] == "session_expired" and code == 1000
    assert SESSION_S - 1 <= lived < SESSION_S + 10


async def until(check, timeout: float, what: str) -> float:
    """Poll ``check()`` until it holds -> the seconds it took; fail after ``timeout``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, what
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_a_client_gone_while_its_prompt_decodes_stops_the_decoding(served):
    """The one media worker decodes a long video (an HTTP request); a realtime response's audio
    waits behind it. The client closes its session: the audio item leaves the queue at once
    (counted cancelled), not after the video."""
    _, base = served
    host, port = base.removeprefix("http://").split(":")
    slow = json.dumps(media_body("video", "video/mp4", slow_video())).encode()
    depth = lambda: metric(base, "omniwalk_media_queue_depth")  # noqa: E731 - items in the pool
    cancelled = metric(base, "omniwalk_media_cancelled_total", kind="audio")
    speech = np.random.default_rng(1).integers(-3000, 3000, 24_000, dtype=np.int16).tobytes()  # 1 s
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(speech).decode()}],
    }

    async def run():
        ws = await connect(base)
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await events_until(ws, lambda e: e["type"] == "conversation.item.done")
        reader, writer = await asyncio.open_connection(host, int(port))  # the video's client
        head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        writer.write(f"{head}content-length: {len(slow)}\r\n\r\n".encode() + slow)
        await until(lambda: depth() == 1, 10, "the video did not reach the pool")
        await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        await until(lambda: depth() == 2, 10, "the response's audio did not reach the pool")
        await ws.close()  # the client goes away while its prompt's audio waits for the worker
        stopped = await until(
            lambda: metric(base, "omniwalk_media_cancelled_total", kind="audio") > cancelled,
            0.5,
            "the response's audio was still queued 0.5 s after its client went away",
        )
        still_decoding = depth() == 1
        writer.close()  # (the video's client hangs up too: its decoding stops)
        await until(lambda: depth() == 0, 5, "the video's decoding went on after its client hung up")
        return stopped, still_decoding

    stopped, still_decoding = asyncio.run(run())
    print(f"the response's audio left the queue {stopped:.3f} s after its session closed")
    assert still_decoding  # (the video was still being decoded: the audio would have waited for it)
    assert metric(base, "omniwalk_media_cancelled_total", kind="audio") == cancelled + 1
