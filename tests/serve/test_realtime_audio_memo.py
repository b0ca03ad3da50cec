"""A realtime session decodes each user audio item once: its chat bodies carry a reference per audio
part (``conversation.AudioMemo``), so later responses reuse the arrays instead of sending the whole
conversation's audio through base64, JSON and the media pool again.

Unit level: a conversation's requests through a media pool of 2 queued items (the arrays equal the
HTTP path's decode of the same WAV), the memo's entries living while held, an HTTP context never
resolving a reference. Against a live tiny server with ``--max-media-queue 2``: server VAD turns with
preemptive answers, and committed turns with transcription, each audio item decoded once
(``omniwalk_media_decode_seconds_count{kind="audio"}``) and every answer without an ``error``; a chat
completion whose ``input_audio.data`` is a reference a session holds is a 400.
"""

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest
import websockets
from helpers.live_server import metric, server

from omniwalk.bench.workload import speech_like
from omniwalk.config import ServerConfig
from omniwalk.media.limits import MediaLimits
from omniwalk.media.preprocess import preprocess
from omniwalk.models.family import ModelInfo
from omniwalk.serve import openai_api as api
from omniwalk.serve.audio_store import AudioStore
from omniwalk.serve.errors import APIError
from omniwalk.serve.media_pool import MediaPool
from omniwalk.serve.metrics import Metrics
from omniwalk.serve.realtime.bounds import AudioBudget, ConversationLimits
from omniwalk.serve.realtime.conversation import Conversation, Message, Part, audio_ref, wav_bytes
from omniwalk.serve.realtime.response import engine_request

RATE = 24000
DECODES = "omniwalk_media_decode_seconds_count"
TEXT = {"output_modalities": ["text"], "max_output_tokens": 2, "temperature": 0.0}


def samples(seconds: float, seed: int) -> np.ndarray:
    return (np.clip(speech_like(seconds, seed, RATE), -1, 1) * 32767).astype(np.int16)


def quiet(seconds: float, seed: int) -> np.ndarray:
    return (0.002 * 32767 * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.int16)


# ---- unit level ----


def context(max_queued: int) -> tuple[api.Context, Metrics]:
    metrics = Metrics()
    pool = MediaPool(MediaLimits(), 1, max_queued, metrics)
    return api.Context(ServerConfig(), pool, AudioStore(4, 60), ModelInfo("m")), metrics


def conversation() -> Conversation:
    return Conversation(ConversationLimits(2**30, 2**30), AudioBudget(2**31))


def user_audio(audio: np.ndarray, item_id: str) -> Message:
    return Message(item_id, "user", [Part("audio", audio=audio)])


def test_each_audio_item_is_decoded_once_through_a_small_pool():
    """Six turns, a request after each, through a pool that queues 2 items: the n-th request decodes
    only its new item (before: all n at once, a 429 from the third on), and every request's arrays
    equal the pool's decode of the item's WAV (the HTTP path)."""
    ctx, metrics = context(max_queued=2)
    talk = conversation()
    ctx = api.Context(ctx.cfg, ctx.pool, ctx.store, ctx.info, audio_memo=talk.memo)
    audios = [samples(0.5 + 0.1 * i, i) for i in range(6)]
    expected = [preprocess("audio", wav_bytes(a))["audio"] for a in audios]

    async def run() -> list[list[dict]]:
        requests = []
        for i, audio in enumerate(audios):
            talk.add(user_audio(audio, f"item_{i}"))
            request, _ = await engine_request({"messages": talk.chat_messages()}, ctx)
            requests.append(request)
            assert metrics.registry.get_sample_value(DECODES, {"kind": "audio"}) == i + 1
        return requests

    requests = asyncio.run(run())
    ctx.pool.close()
    for i, request in enumerate(requests):
        decoded = [m["content"][0]["audio"] for m in request["messages"]]
        assert len(decoded) == i + 1
        for got, want in zip(decoded, expected, strict=False):
            np.testing.assert_array_equal(got, want)


def test_concurrent_requests_share_a_decode_and_a_failed_one_is_tried_again():
    """A response and a transcription of one turn at once: one decode. A first decode that meets a
    full queue fails its request (a 429); the next request decodes it."""
    ctx, metrics = context(max_queued=2)
    talk = conversation()
    ctx = api.Context(ctx.cfg, ctx.pool, ctx.store, ctx.info, audio_memo=talk.memo)
    talk.add(user_audio(samples(0.5, 3), "a"))
    body = {"messages": talk.chat_messages()}

    async def run():
        ctx.pool.num_queued = ctx.pool.max_queued  # (the pool is full: other requests' media)
        with pytest.raises(APIError) as full:
            await engine_request(body, ctx)
        ctx.pool.num_queued = 0
        first, second = await asyncio.gather(engine_request(body, ctx), engine_request(body, ctx))
        return full.value, first[0], second[0]

    full, first, second = asyncio.run(run())
    ctx.pool.close()
    assert full.status == 429 and full.code == "media_queue_full"
    assert metrics.registry.get_sample_value(DECODES, {"kind": "audio"}) == 1
    np.testing.assert_array_equal(
        first["messages"][0]["content"][0]["audio"], second["messages"][0]["content"][0]["audio"]
    )


def test_a_request_counts_memoised_audio_against_its_media_budget():
    """Two items that decode within the request budget alone but not together: the second request is
    refused as the same chat over HTTP (base64 WAV) is, though both items are memoised."""
    per_item = {f"max_{kind}_decoded_bytes": RATE * 4 for kind in ("audio", "image", "video")}  # 1 s
    limits = MediaLimits(**per_item, max_request_decoded_bytes=RATE * 6)  # 1.5 s
    ctx, _ = context(max_queued=2)
    pool = MediaPool(limits, 1, 2, Metrics())
    talk = conversation()
    session_ctx = api.Context(ctx.cfg, pool, ctx.store, ctx.info, audio_memo=talk.memo)
    http_ctx = api.Context(ctx.cfg, pool, ctx.store, ctx.info)
    audios = [samples(0.9, 4), samples(0.9, 5)]

    async def refusal(body: dict, ctx: api.Context) -> tuple:
        with pytest.raises(APIError) as refused:
            await engine_request(body, ctx)
        return refused.value.status, refused.value.param

    async def run():
        talk.add(user_audio(audios[0], "a"))
        await engine_request({"messages": talk.chat_messages()}, session_ctx)  # (memoised)
        talk.add(user_audio(audios[1], "b"))
        session = await refusal({"messages": talk.chat_messages()}, session_ctx)
        wav = [
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(a)).decode()}} for a in audios
        ]
        http = await refusal({"messages": [{"role": "user", "content": [w]} for w in wav]}, http_ctx)
        return session, http

    session, http = asyncio.run(run())
    pool.close()
    ctx.pool.close()
    assert session == http == (400, "messages[1].content[0].input_audio.data")


def test_a_memo_entry_lives_while_an_item_holds_it():
    talk = conversation()
    audio = samples(0.3, 7)
    first, twin = user_audio(audio, "a"), user_audio(audio.copy(), "b")  # the same audio, one entry
    ref = first.parts[0].ref
    assert ref == twin.parts[0].ref == audio_ref(audio) and first.chat_message()["content"][0]["input_audio"] == {
        "data": ref
    }
    talk.add(first)
    talk.add(twin)
    talk.add(Message("c", "assistant", [Part("audio", text="hi", audio_ms=500)]))
    assert set(talk.memo.entries) == {ref} and talk.memo.entries[ref].num_holders == 2
    talk.delete("a")
    assert talk.memo.holds(ref)
    talk.delete("b")
    assert not talk.memo.holds(ref) and talk.memo.entries == {}
    talk.add(user_audio(samples(0.3, 8), "d"))
    talk.close()
    assert talk.memo.entries == {}


def test_an_http_context_never_resolves_a_reference():
    """Without a session's memo, a reference is the base64 it is not: a 400 naming the part."""
    ctx, _ = context(max_queued=2)
    body = {"messages": [user_audio(samples(0.3, 9), "a").chat_message()]}
    with pytest.raises(APIError) as refused:
        asyncio.run(engine_request(body, ctx))
    ctx.pool.close()
    assert refused.value.status == 400 and refused.value.param == "messages[0].content[0].input_audio.data"


# ---- against a live server ----


@pytest.fixture(scope="module")
def base_url():
    with server("--max-media-queue", "2") as base:
        yield base


class Client:
    def __init__(self, ws):
        self.ws, self.events = ws, []

    async def send(self, kind: str, **fields) -> None:
        await self.ws.send(json.dumps({"type": kind, **fields}))

    async def append(self, audio: np.ndarray, chunk_ms: int = 100) -> None:
        step = RATE * chunk_ms // 1000
        for i in range(0, len(audio), step):
            data = base64.b64encode(audio[i : i + step].astype("<i2").tobytes()).decode()
            await self.send("input_audio_buffer.append", audio=data)

    async def until(self, kind: str, count: int = 1) -> list[dict]:
        """Events up to the ``count``-th of ``kind`` from now (kept in ``events`` too)."""
        got = []
        while sum(e["type"] == kind for e in got) < count:
            got.append(json.loads(await asyncio.wait_for(self.ws.recv(), 120)))
            assert got[-1]["type"] != "error", got[-1]  # (before: media_queue_full from the third turn on)
        self.events += got
        return got


async def session(base_url: str, scene) -> list[dict]:
    url = base_url.replace("http", "ws", 1) + "/v1/realtime"
    async with websockets.connect(url, max_size=2**26) as ws:
        c = Client(ws)
        await c.until("session.created")
        await scene(c)
        return c.events


def preemptions(base_url: str, outcome: str) -> float:
    return metric(base_url, "omniwalk_realtime_preemptions_total", outcome=outcome)


def test_vad_turns_with_preemptive_answers_decode_each_turn_once(base_url):
    """Four spoken turns (server VAD, preemptive answers on): four audio decodes in all, each turn's
    prepared answer kept (the confirmed turn's body, its audio by reference, equals the prepared one)."""
    num_turns = 4
    decodes, kept = metric(base_url, DECODES, kind="audio"), preemptions(base_url, "kept")

    async def scene(c: Client) -> None:
        td = {"type": "server_vad", "preemptive_silence_ms": 200}
        await c.send("session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": td}}, **TEXT})
        await c.until("session.updated")
        for turn in range(num_turns):
            await c.append(np.concatenate([quiet(0.4, turn), samples(1.0, 10 + turn), quiet(1.0, turn)]))
            await c.until("response.done")

    events = asyncio.run(session(base_url, scene))
    assert [e for e in events if e["type"] == "error"] == []
    done = [e["response"] for e in events if e["type"] == "response.done"]
    assert [r["status"] for r in done] == ["incomplete"] * num_turns  # (each at max_output_tokens)
    assert metric(base_url, DECODES, kind="audio") - decodes == num_turns
    assert preemptions(base_url, "kept") - kept == num_turns


def test_committed_turns_with_transcription_decode_each_item_once(base_url):
    """Five committed turns, each transcribed and answered: five decodes (the transcription and the
    answers share them); after deleting the first item, another answer decodes nothing."""
    num_turns = 5
    decodes = metric(base_url, DECODES, kind="audio")

    async def scene(c: Client) -> None:
        audio = {"input": {"turn_detection": None, "transcription": {"model": "any"}}}
        await c.send("session.update", session={"type": "realtime", "audio": audio, **TEXT})
        await c.until("session.updated")
        for turn in range(num_turns):
            await c.append(samples(0.6, 20 + turn))
            await c.send("input_audio_buffer.commit")
            await c.until("conversation.item.input_audio_transcription.completed")
            await c.send("response.create")
            await c.until("response.done")
        first = next(e["item_id"] for e in c.events if e["type"] == "input_audio_buffer.committed")
        await c.send("conversation.item.delete", item_id=first)
        await c.until("conversation.item.deleted")
        await c.send("response.create")
        await c.until("response.done")

    events = asyncio.run(session(base_url, scene))
    assert [e for e in events if e["type"] in ("error", "conversation.item.input_audio_transcription.failed")] == []
    done = [e["response"] for e in events if e["type"] == "response.done"]
    assert [r["status"] for r in done] == ["incomplete"] * (num_turns + 1)
    assert metric(base_url, DECODES, kind="audio") - decodes == num_turns


def test_a_chat_completion_carrying_a_sessions_reference_is_a_400(base_url):
    """A reference a live session holds, sent by an HTTP client: ordinary (invalid) base64, not resolved."""
    audio = samples(0.5, 30)
    refused = {}

    async def scene(c: Client) -> None:
        item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm(audio)}]}
        await c.send("conversation.item.create", item=item)
        await c.until("conversation.item.done")
        await c.send("response.create", response=TEXT)  # (the session has decoded it: the memo holds it)
        await c.until("response.done")
        part = {"type": "input_audio", "input_audio": {"data": audio_ref(audio), "format": "wav"}}
        body = {"messages": [{"role": "user", "content": [part]}], "max_tokens": 2}
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
        refused.update(status=response.status_code, error=response.json()["error"])

    events = asyncio.run(session(base_url, scene))
    assert [e for e in events if e["type"] == "error"] == []
    assert refused["status"] == 400
    assert refused["error"]["param"] == "messages[0].content[0].input_audio.data"
    assert "not valid base64" in refused["error"]["message"]


def pcm(audio: np.ndarray) -> str:
    return base64.b64encode(audio.astype("<i2").tobytes()).decode()
