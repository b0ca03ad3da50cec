"""Preemptive answers against a live tiny server: the same audio streamed into a session with
preemption on and into one with it off gives the client the same events, for a turn, a turn with a
pause inside it (longer than the tentative silence, shorter than the confirming one), a barge-in
and a ``response.cancel``; the preemptions are counted in /metrics, and a discarded one leaves no
item in the conversation and no page held.

Answers are greedy, so the events of a whole turn (text, audio, ids aside) are compared exactly;
a barge-in or a cancel lands at a point that depends on timing, so those are compared by structure.

Under load (``--realtime-preemption-max-responses``): while other sessions generate that many
answers, a tentative end of turn starts none (counted ``skipped``) and the client's events equal
those with preemption off; one response fewer, and the answers are prepared as before.
"""

import asyncio
import base64
import contextlib
import json
import re
import time
import urllib.request

import numpy as np
import pytest
import websockets
from helpers.live_server import server

from omniwalk.bench.workload import speech_like
from omniwalk.cli import build_parser, serve_configs
from omniwalk.config import ConfigError, ServerConfig

RATE = 24000
GREEDY = {"temperature": 0.0, "talker_temperature": 0.0, "code_predictor_temperature": 0.0}
SHORT = {"max_output_tokens": 4, "min_audio_frames": 6, "max_audio_frames": 6}
LONG = {"max_output_tokens": 4, "min_audio_frames": 400, "max_audio_frames": 400}  # (still playing when cut)
ID = re.compile(r"(item|resp|call|event)_[0-9a-f]{24}")


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def speech(seconds: float, seed: int) -> bytes:
    return pcm16(speech_like(seconds, seed, RATE))


def quiet(seconds: float, seed: int = 0) -> bytes:
    return pcm16(0.002 * np.random.default_rng(seed).standard_normal(int(seconds * RATE)))


TURN = quiet(0.4) + speech(1.0, 1) + quiet(1.0, 1)
PAUSED = quiet(0.4) + speech(1.0, 2) + quiet(0.3, 2) + speech(0.5, 3) + quiet(1.0, 3)


class Client:
    def __init__(self, ws):
        self.ws, self.events = ws, []

    async def send(self, kind: str, **fields) -> None:
        await self.ws.send(json.dumps({"type": kind, **fields}))

    async def append(self, audio: bytes, chunk_ms: int = 100) -> None:
        step = RATE * 2 * chunk_ms // 1000
        for i in range(0, len(audio), step):
            await self.send("input_audio_buffer.append", audio=base64.b64encode(audio[i : i + step]).decode())

    async def until(self, kind: str, count: int = 1) -> list[dict]:
        """Events up to the ``count``-th of ``kind`` from now (kept in ``events`` too)."""
        got = []
        while sum(e["type"] == kind for e in got) < count:
            got.append(json.loads(await asyncio.wait_for(self.ws.recv(), 180)))
        self.events += got
        return got


async def conversation(base_url: str, preemptive_silence_ms: int) -> dict[str, list[dict]]:
    """Four scenes in one session; each scene's events."""
    url = base_url.replace("http", "ws", 1) + "/v1/realtime"
    async with websockets.connect(url, max_size=2**26) as ws:
        c = Client(ws)
        await c.until("session.created")
        td = {"type": "server_vad", "preemptive_silence_ms": preemptive_silence_ms}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": td}, "output": {"voice": "ethan"}}}
        await c.send("session.update", session={**session, **GREEDY, **SHORT})
        await c.until("session.updated")
        scenes = {}
        await c.append(TURN)
        scenes["turn"] = await c.until("response.done")
        await c.append(PAUSED)
        scenes["paused"] = await c.until("response.done")
        await c.send("session.update", session=LONG)
        await c.until("session.updated")
        await c.append(TURN)
        scene = await c.until("response.output_audio.delta")
        await c.send("session.update", session=SHORT)  # (for the answers after this one)
        await c.append(speech(0.8, 4) + quiet(1.0, 4))  # talking over the answer
        scenes["barge_in"] = scene + await c.until("response.done", 2)
        await c.send("session.update", session=LONG)
        await c.until("session.updated")
        await c.append(TURN)
        scene = await c.until("response.created")
        await c.send("response.cancel")
        scenes["cancel"] = scene + await c.until("response.done")
        return scenes


def normalized(events: list[dict]) -> list[dict]:
    """Events with ids numbered in order of appearance (the same ids wherever they recur), no event ids,
    no cached-token counts (what the prefix cache held: the run before filled it with this conversation)."""
    ids: dict[str, str] = {}

    def norm(value):
        if isinstance(value, dict):
            return {k: norm(v) for k, v in value.items() if k not in ("event_id", "cached_tokens")}
        if isinstance(value, list):
            return [norm(v) for v in value]
        if isinstance(value, str) and ID.fullmatch(value):
            return ids.setdefault(value, f"{value.split('_')[0]}{len(ids)}")
        return value

    return [norm(e) for e in events]


def structure(events: list[dict]) -> list[tuple]:
    """Types but deltas (how many stream before a cut is timing), with each response's status and each
    item's type and role."""
    out = []
    for e in events:
        if e["type"].endswith(".delta") or e["type"] == "session.updated":
            continue
        item = e.get("item") or {}
        status = e["response"]["status"] if e["type"] == "response.done" else None
        out.append((e["type"], item.get("type"), item.get("role"), status))
    return out


def preemptions(base_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{base_url}/metrics").read().decode()
    found = re.findall(r'omniwalk_realtime_preemptions_total\{outcome="(\w+)"\} ([\d.]+)', text)
    return {outcome: float(n) for outcome, n in found}


def wait_idle(base_url: str) -> None:
    """The engine holds no request and no KV page (stats arrive asynchronously)."""
    deadline = time.monotonic() + 30
    while True:
        text = urllib.request.urlopen(f"{base_url}/metrics").read().decode()
        idle = all(
            f'omniwalk_engine{{quantity="{q}",replica="0",stage="{s}"}} 0.0' in text
            for q, s in (("kv_pages_used", "thinker"), ("kv_pages_used", "talker"), ("requests", "engine"))
        )
        if idle or time.monotonic() > deadline:
            assert idle, text
            return
        time.sleep(0.2)


def test_preemption_changes_nothing_the_client_sees(base_url):
    before = preemptions(base_url)
    off = asyncio.run(conversation(base_url, 0))
    assert preemptions(base_url) == before  # (off: none started)
    on = asyncio.run(conversation(base_url, 200))
    counted = {k: v - before.get(k, 0.0) for k, v in preemptions(base_url).items()}
    wait_idle(base_url)  # every discarded answer's pages freed

    for scene in ("turn", "paused"):
        assert normalized(on[scene]) == normalized(off[scene]), scene
        added = [e["item"]["role"] for e in on[scene] if e["type"] == "conversation.item.added"]
        assert added == ["user", "assistant"]  # one turn (the pause inside it), one answer
        assert on[scene][-1]["response"]["status"] == "incomplete"  # (at max_output_tokens)
    for scene in ("barge_in", "cancel"):
        assert structure(on[scene]) == structure(off[scene]), scene
    done = [e["response"] for e in on["barge_in"] + on["cancel"] if e["type"] == "response.done"]
    assert [(r["status"], (r["status_details"] or {}).get("reason")) for r in done] == [
        ("cancelled", "turn_detected"),
        ("incomplete", "max_output_tokens"),
        ("cancelled", "client_cancelled"),
    ]
    # a tentative end per turn, and one in the pause: that one discarded when the voice came back
    assert counted["discarded"] >= 1 and counted["kept"] >= 3
    assert counted["started"] == counted["kept"] + counted["discarded"]


# ---- under load: realtime_preemption_max_responses ----

MAX_RESPONSES = 2
BUSY = {"max_output_tokens": 4, "min_audio_frames": 4000, "max_audio_frames": 4000}  # (cancelled once done with)


@pytest.fixture(scope="module")
def limited_url():
    with server("--realtime-preemption-max-responses", str(MAX_RESPONSES)) as base:
        yield base


async def turns_beside(base_url: str, preemptive_silence_ms: int, num_busy: int) -> list[dict]:
    """A session's two turns (one with a pause inside) while ``num_busy`` other sessions generate an
    answer each (started before, cancelled after: each one's ``response.done`` says cancelled, so it
    was being generated all along); the session's events."""
    url = base_url.replace("http", "ws", 1) + "/v1/realtime"
    async with contextlib.AsyncExitStack() as stack:
        connect = lambda: stack.enter_async_context(websockets.connect(url, max_size=2**26))  # noqa: E731
        busy = []
        for _ in range(num_busy):
            other = Client(await connect())
            await other.until("session.created")
            hello = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}
            await other.send("conversation.item.create", item=hello)
            await other.send("response.create", response={**GREEDY, **BUSY})
            await other.until("response.output_audio.delta")
            busy.append(other)
        c = Client(await connect())
        await c.until("session.created")
        td = {"type": "server_vad", "preemptive_silence_ms": preemptive_silence_ms}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": td}, "output": {"voice": "ethan"}}}
        await c.send("session.update", session={**session, **GREEDY, **SHORT})
        events = await c.until("session.updated")
        for audio in (TURN, PAUSED):
            await c.append(audio)
            events += await c.until("response.done")
        for other in busy:
            await other.send("response.cancel")
            assert (await other.until("response.done"))[-1]["response"]["status"] == "cancelled"
        return [e for e in events if e["type"] != "session.updated"]


def test_no_preemption_while_the_server_generates_its_limit_of_responses(limited_url):
    def run(preemptive_silence_ms: int, num_busy: int) -> tuple[list[dict], dict[str, float]]:
        before = preemptions(limited_url)
        events = asyncio.run(turns_beside(limited_url, preemptive_silence_ms, num_busy))
        after = preemptions(limited_url)
        return normalized(events), {k: n - before.get(k, 0.0) for k, n in after.items() if n != before.get(k, 0.0)}

    off, counted = run(0, MAX_RESPONSES)
    assert counted == {}
    added = [e["item"]["role"] for e in off if e["type"] == "conversation.item.added"]
    assert added == ["user", "assistant"] * 2
    # the limit reached: each tentative end (one per turn, one in the pause) skipped, the events as with it off
    at_limit, counted = run(200, MAX_RESPONSES)
    assert counted == {"skipped": 3}
    assert at_limit == off
    # one response fewer: prepared as without a limit (the pause's answer discarded, the others kept)
    below, counted = run(200, MAX_RESPONSES - 1)
    assert counted == {"started": 3, "kept": 2, "discarded": 1}
    assert below == off
    wait_idle(limited_url)


def test_the_preemption_limit_is_a_count_or_none():
    assert ServerConfig().realtime_preemption_max_responses == 16
    assert ServerConfig(realtime_preemption_max_responses=0).realtime_preemption_max_responses == 0  # no limit
    with pytest.raises(ConfigError, match="realtime_preemption_max_responses must be >= 0, got -1"):
        ServerConfig(realtime_preemption_max_responses=-1)
    args = build_parser().parse_args(["serve", "--realtime-preemption-max-responses", "4"])
    assert serve_configs(args)[0].realtime_preemption_max_responses == 4
