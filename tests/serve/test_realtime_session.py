"""A realtime ``Session`` in process, the engine's run a stand-in that answers one word.

A response is over for the session once its ``response.done`` is on its way: a client that answers
it at once with ``response.create`` (as the Agents SDK does after a tool's output) gets the next
response, not ``conversation_already_has_active_response``, while the first one's send is still
going on.

A session's audio waits, bounded, for a place in a full media queue
(``ServerConfig.realtime_max_media_wait_s``) instead of ending its turn with an error.

The pool (1 worker, 1 place) is kept busy by an item whose decode is held until the test lets it
go. Pool level: an item without a wait is refused at once (the HTTP path's 429), waiters get the
places in order as items leave, and a waiter whose wait runs out or whose task is cancelled
leaves nothing behind. Session level (a ``Session`` in process, the engine's run a stand-in that
answers one word): a turn whose audio meets the full queue is answered, without an ``error``
event, once the queue has room within the bound; past the bound it gets the ``error`` event a
full queue gave before (``media_queue_full``) and no response; a tentative end of turn does not
wait (no answer is prepared: the session's events go on, and the confirmed turn waits).
"""

import asyncio
import base64
import json
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter

from omniwalk.bench.workload import speech_like
from omniwalk.config import ConfigError, ServerConfig
from omniwalk.media.limits import MediaLimits
from omniwalk.media.preprocess import preprocess
from omniwalk.models.family import ModelInfo
from omniwalk.serve import openai_api as api
from omniwalk.serve.audio_store import AudioStore
from omniwalk.serve.errors import APIError
from omniwalk.serve.media_pool import MediaPool
from omniwalk.serve.metrics import Metrics
from omniwalk.serve.realtime.bounds import AudioBudget
from omniwalk.serve.realtime.conversation import wav_bytes
from omniwalk.serve.realtime.preemption import Preemptions
from omniwalk.serve.realtime.session import Emitter, Session
from omniwalk.serve.wire import Delta, Finished

RATE = 24000


def samples(seconds: float, seed: int) -> np.ndarray:
    return (np.clip(speech_like(seconds, seed, RATE), -1, 1) * 32767).astype(np.int16)


def quiet(seconds: float, seed: int) -> np.ndarray:
    return (0.002 * 32767 * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.int16)


def b64_wav(audio: np.ndarray) -> str:
    return base64.b64encode(wav_bytes(audio)).decode()


class HeldPool(MediaPool):
    """A pool of 1 worker and 1 place whose decodes wait for ``gate`` (the queue kept busy)."""

    def __init__(self):
        super().__init__(MediaLimits(), workers=1, max_queued=1, metrics=Metrics())
        self.gate = threading.Event()

    def _work(self, *args) -> dict:
        assert self.gate.wait(60)
        return super()._work(*args)

    async def occupy(self) -> asyncio.Task:
        """An item that takes the place and holds it until ``gate`` is set."""
        busy = asyncio.ensure_future(self.decode("audio", b64_wav(samples(0.2, 99)), "busy", is_base64=True))
        while self.num_queued < 1:
            await asyncio.sleep(0)
        return busy


async def until(condition, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


# ---- the pool ----


def test_waiters_get_places_in_order_and_the_rest_are_refused():
    async def run():
        pool = HeldPool()
        busy = await pool.occupy()
        with pytest.raises(APIError) as refused:  # (no wait: HTTP's 429, at once)
            await pool.decode("audio", b64_wav(samples(0.2, 1)), "now", is_base64=True)
        finished = []

        async def waiting(name: str, seed: int) -> dict:
            part = await pool.decode("audio", b64_wav(samples(0.3, seed)), name, is_base64=True, max_wait_s=30)
            finished.append(name)
            return part

        first = asyncio.ensure_future(waiting("first", 2))
        await until(lambda: len(pool.waiters) == 1)
        second = asyncio.ensure_future(waiting("second", 3))
        await until(lambda: len(pool.waiters) == 2)
        with pytest.raises(APIError):  # (the place a waiter is owed is not taken by a new item)
            await pool.decode("audio", b64_wav(samples(0.2, 4)), "later", is_base64=True)
        pool.gate.set()
        parts = await asyncio.gather(busy, first, second)
        pool.close()
        return refused.value, finished, parts, pool

    refused, finished, parts, pool = asyncio.run(run())
    assert (refused.status, refused.code) == (429, "media_queue_full")
    assert finished == ["first", "second"]
    for part, seed in zip(parts[1:], (2, 3), strict=True):
        np.testing.assert_array_equal(part["audio"], preprocess("audio", wav_bytes(samples(0.3, seed)))["audio"])
    assert pool.num_queued == 0 and not pool.waiters


def test_a_waiter_that_gives_up_leaves_nothing_behind():
    """One whose wait runs out gets the 429; one cancelled goes; the place goes on to the next waiter."""

    async def run():
        pool = HeldPool()
        busy = await pool.occupy()
        audio = b64_wav(samples(0.2, 5))
        with pytest.raises(APIError) as timed_out:
            await pool.decode("audio", audio, "short", is_base64=True, max_wait_s=0.05)
        cancelled = asyncio.ensure_future(pool.decode("audio", audio, "gone", is_base64=True, max_wait_s=30))
        patient = asyncio.ensure_future(pool.decode("audio", audio, "patient", is_base64=True, max_wait_s=30))
        await until(lambda: len(pool.waiters) == 2)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert len(pool.waiters) == 1
        pool.gate.set()
        await asyncio.gather(busy, patient)
        pool.close()
        return timed_out.value, cancelled, pool

    timed_out, cancelled, pool = asyncio.run(run())
    assert (timed_out.status, timed_out.code) == (429, "media_queue_full")
    assert cancelled.cancelled()
    assert pool.num_queued == 0 and not pool.waiters


# ---- a session ----


class OneWord:
    """The engine's run, standing in: one text delta, then the end (records the request)."""

    requests: list[dict] = []

    def __init__(self, request: dict):
        self.requests.append(request)
        self.events = [
            Delta(request["request_id"], "text", "Hi"),
            Finished(
                request["request_id"],
                {
                    "finish_reason": "stop",
                    "token_ids": [1],
                    "codes": None,
                    "prompt_token_ids": [1, 2, 3],
                    "num_cached_tokens": 0,
                    "num_audio_prompt_tokens": 0,
                },
            ),
        ]

    async def first_event(self):
        return self.events.pop(0)

    async def next_event(self):
        return self.events.pop(0)

    async def close(self) -> None:
        pass


async def session(pool: MediaPool, max_wait_s: float, on_sent=None) -> tuple[Session, list[dict], Counter]:
    """A session answering in text (the stand-in model has no audio out); its events from then on
    (``on_sent``: awaited with each event, the send not over until it returns)."""
    cfg = ServerConfig(realtime_max_media_wait_s=max_wait_s)
    events: list[dict] = []

    async def send_text(text: str) -> None:
        events.append(json.loads(text))
        if on_sent is not None:
            await on_sent(events[-1])

    counter = Counter("preemptions", "by outcome", ["outcome"], registry=CollectorRegistry())
    context = api.Context(cfg, pool, AudioStore(4, 60), ModelInfo("m"))
    s = Session(Emitter(send_text, False), cfg, context, OneWord, 2**31, AudioBudget(2**31), Preemptions(counter, 16))
    text_only = {"type": "realtime", "output_modalities": ["text"]}
    await s.handle(json.dumps({"type": "session.update", "session": text_only}))
    assert [e["type"] for e in events] == ["session.updated"]
    events.clear()
    return s, events, counter


def user_audio_item(audio: np.ndarray) -> str:
    pcm = base64.b64encode(audio.astype("<i2").tobytes()).decode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm}]}
    return json.dumps({"type": "conversation.item.create", "item": item})


RESPOND = json.dumps({"type": "response.create"})


def test_a_response_create_answering_response_done_at_once_gets_its_response():
    async def run():
        sent, held = asyncio.Event(), asyncio.Event()

        async def on_sent(event: dict) -> None:
            if event["type"] == "response.done" and not sent.is_set():
                sent.set()  # (the client has it; the server's send is not over yet)
                await held.wait()

        pool = MediaPool(MediaLimits(), workers=1, max_queued=1, metrics=Metrics())
        s, events, _ = await session(pool, max_wait_s=0, on_sent=on_sent)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        await s.handle(json.dumps({"type": "conversation.item.create", "item": item}))
        await s.handle(RESPOND)
        first = s.response
        await sent.wait()
        assert not first.task.done()
        handling = asyncio.ensure_future(s.handle(RESPOND))  # (its events queue behind the held send)
        await asyncio.sleep(0.05)
        held.set()
        await handling
        await asyncio.gather(first.task, s.response.task)
        await s.close()
        pool.close()
        return events

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, [e for e in events if e["type"] == "error"]
    assert kinds.count("response.created") == 2 and kinds.count("response.done") == 2
    created = [i for i, kind in enumerate(kinds) if kind == "response.created"]
    assert kinds.index("response.done") < created[1]  # (the first ends, then the next starts)
    assert [e["response"]["status"] for e in events if e["type"] == "response.done"] == ["completed", "completed"]


def test_a_turn_meeting_a_full_queue_is_answered_once_there_is_room():
    audio = samples(0.5, 6)

    async def run():
        pool = HeldPool()
        s, events, _ = await session(pool, max_wait_s=30)
        busy = await pool.occupy()
        await s.handle(user_audio_item(audio))
        handling = asyncio.ensure_future(s.handle(RESPOND))
        await until(lambda: len(pool.waiters) == 1)  # (its audio waits for the place)
        pool.gate.set()
        await asyncio.gather(busy, handling)
        await s.response.task
        await s.close()
        pool.close()
        return events

    OneWord.requests.clear()
    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert "error" not in kinds
    assert kinds[kinds.index("response.created") :] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[-1]["response"]["status"] == "completed"
    (request,) = OneWord.requests
    heard = request["messages"][-1]["content"][0]["audio"]
    np.testing.assert_array_equal(heard, preprocess("audio", wav_bytes(audio))["audio"])


@pytest.mark.parametrize("max_wait_s", [0.0, 0.1])
def test_past_the_bound_the_full_queue_error_comes(max_wait_s):
    async def run():
        pool = HeldPool()
        s, events, _ = await session(pool, max_wait_s)
        busy = await pool.occupy()
        await s.handle(user_audio_item(samples(0.5, 7)))
        await s.handle(RESPOND)
        pool.gate.set()
        await busy
        await s.close()
        pool.close()
        return events, s

    events, s = asyncio.run(run())
    assert [e["type"] for e in events] == [
        "conversation.item.added",
        "conversation.item.done",
        "error",
    ]
    error = events[-1]["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "media_queue_full")
    assert error["message"] == "the media decoding queue is full; retry shortly"
    assert s.response is None


def test_a_tentative_end_of_turn_does_not_wait_for_the_queue():
    """Server VAD: the pool is full through the whole turn. No answer is prepared (nothing waits in
    the VAD's stream of events); the confirmed turn's response is the one that waits, and is answered."""
    turn = np.concatenate([quiet(0.4, 1), samples(1.0, 8), quiet(1.0, 2)])
    append = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(turn.tobytes()).decode()})

    async def run():
        pool = HeldPool()
        s, events, counter = await session(pool, max_wait_s=30)
        busy = await pool.occupy()
        handling = asyncio.ensure_future(s.handle(append))
        await until(lambda: len(pool.waiters) == 1)
        waiting_after = [e["type"] for e in events]
        pool.gate.set()
        await asyncio.gather(busy, handling)
        await s.response.task
        await s.close()
        pool.close()
        return waiting_after, events, counter

    waiting_after, events, counter = asyncio.run(run())
    assert waiting_after[-2:] == ["conversation.item.added", "conversation.item.done"]  # (the committed turn's)
    assert "input_audio_buffer.speech_stopped" in waiting_after
    assert counter.labels("started")._value.get() == 0
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and kinds[-1] == "response.done"


def test_the_wait_is_a_duration():
    assert ServerConfig().realtime_max_media_wait_s == 5.0
    assert ServerConfig(realtime_max_media_wait_s=0).realtime_max_media_wait_s == 0  # (no wait: the error at once)
    with pytest.raises(ConfigError, match="realtime_max_media_wait_s must be >= 0, got -1"):
        ServerConfig(realtime_max_media_wait_s=-1)
