"""/v1/realtime against a live `omniwalk serve` (tiny model): the official `openai` SDK's realtime
client (GA and beta), server VAD turns, response.cancel and barge-in, bad events, a vanishing client.

One server for the module (an API key and a small append limit, so those are tested on it too).
Answers are greedy, so a realtime turn is compared with the chat completion of the same conversation.
"""

import asyncio
import base64
import json
import shutil
import time
import urllib.request

import numpy as np
import openai
import pytest
import soundfile
import websockets
from helpers.live_server import server, until

from omniwalk.bench.workload import speech_like
from omniwalk.serve.realtime.conversation import wav_bytes

KEY = "sekret"
GREEDY = {"temperature": 0.0, "talker_temperature": 0.0, "code_predictor_temperature": 0.0, "ignore_eos": True}
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}, "output": {"voice": "ethan"}}}
RATE = 24000
SAMPLES_PER_FRAME = (
    1920  # 12.5 codec frames per second at 24 kHz; a stream's audio is 555 samples short of whole frames
)


@pytest.fixture(scope="module")
def base_url():
    with server("--api-key", KEY, "--realtime-max-append-bytes", "96KiB", "--realtime-max-sessions", "3") as base:
        yield base


def sdk(base_url) -> openai.AsyncOpenAI:
    # (the GA client derives ws:// from base_url; the beta one needs websocket_base_url for plain ws://)
    ws_url = base_url.replace("http", "ws", 1) + "/v1"
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", websocket_base_url=ws_url, api_key=KEY, max_retries=0)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def speech(seconds: float, seed: int = 1) -> bytes:
    return pcm16(speech_like(seconds, seed, RATE))


def quiet(seconds: float) -> bytes:
    return pcm16(0.002 * np.random.default_rng(0).standard_normal(int(seconds * RATE)))


async def append(conn, audio: bytes, chunk_ms: int = 100) -> None:
    step = RATE * 2 * chunk_ms // 1000
    for i in range(0, len(audio), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step]).decode())


def response_order(events: list) -> list[str]:
    """Event types from response.created on, with each run of deltas of one type collapsed."""
    types = [e.type for e in events]
    types = types[types.index("response.created") :]
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


SPOKEN = [
    "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
    "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
    "response.output_item.done", "conversation.item.done", "response.done",
]  # fmt: skip


def assert_spoken_order(events: list) -> None:
    """The protocol's order, deltas (transcript and audio, interleaved) between content_part.added and audio.done."""
    order = [t for t in response_order(events) if not t.endswith(".delta")]
    assert order == SPOKEN, order
    types = [e.type for e in events]
    deltas = [i for i, t in enumerate(types) if t.endswith(".delta")]
    assert types.index("response.content_part.added") < min(deltas) and max(deltas) < types.index(
        "response.output_audio.done"
    )


def audio_of(events: list) -> bytes:
    return b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")


def chat(base_url: str, content, modalities, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "modalities": modalities, **GREEDY, **extra}
    if "audio" in modalities:
        body["audio"] = {"voice": "ethan", "format": "pcm16"}
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def metrics(base_url: str) -> str:
    request = urllib.request.Request(f"{base_url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    return urllib.request.urlopen(request).read().decode()


def wait_idle(base_url: str) -> str:
    """/metrics once the engine holds no request and no KV page (stats arrive asynchronously)."""
    deadline = time.monotonic() + 30
    while True:
        text = metrics(base_url)
        idle = 'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="thinker"} 0.0' in text
        idle &= 'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="talker"} 0.0' in text
        idle &= 'omniwalk_engine{quantity="requests",replica="0",stage="engine"} 0.0' in text
        idle &= "omniwalk_realtime_sessions 0.0" in text
        if idle or time.monotonic() > deadline:
            assert idle, text
            return text
        time.sleep(0.2)


def test_text_turn_equals_the_chat_completion(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect(model="qwen3-omni") as conn:
            created = await conn.recv()
            update = {**NO_VAD, "output_modalities": ["text"], "max_output_tokens": 6, **GREEDY}
            await conn.session.update(session=update)
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}
            )
            await conn.response.create()
            return created, await until(conn)

    created, events = asyncio.run(talk())
    assert created.type == "session.created" and created.session.audio.input.turn_detection.type == "server_vad"
    types = [e.type for e in events]
    assert types[:4] == ["session.updated", "conversation.item.added", "conversation.item.done", "response.created"]
    assert response_order(events) == [
        "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done",
    ]  # fmt: skip
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    want = chat(base_url, "hello there", ["text"], max_tokens=6)
    assert text == want["choices"][0]["message"]["content"] == done.output[0].content[0].text
    assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens"
    assert done.usage.input_tokens == want["usage"]["prompt_tokens"] and done.usage.output_tokens == 6


def test_audio_turn_equals_the_chat_completion_with_audio_input(base_url):
    heard = speech(1.0)
    frames = 12

    async def talk():
        async with sdk(base_url).realtime.connect() as conn:
            await conn.recv()
            await conn.session.update(
                session={
                    **NO_VAD,
                    "max_output_tokens": 5,
                    "min_audio_frames": frames,
                    "max_audio_frames": frames,
                    **GREEDY,
                }  # fmt: skip
            )
            await append(conn, heard)
            await conn.input_audio_buffer.commit()
            committed = await until(conn, "conversation.item.done")
            await conn.response.create()
            return committed, await until(conn)

    committed, events = asyncio.run(talk())
    assert [e.type for e in committed][-3:] == [
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"
    ]  # fmt: skip
    assert committed[-1].item.content[0].type == "input_audio"
    assert_spoken_order(events)
    pcm = audio_of(events)
    assert len(pcm) == 2 * (SAMPLES_PER_FRAME * frames - 555)  # PCM16 of exactly the frames generated
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    done = events[-1].response
    assert transcript == done.output[0].content[0].transcript and done.output[0].content[0].type == "output_audio"
    assert done.usage.output_token_details.audio_tokens == frames and done.usage.output_token_details.text_tokens == 5
    data = base64.b64encode(wav_bytes(np.frombuffer(heard, "<i2"))).decode()
    want = chat(
        base_url,
        [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}],
        ["text", "audio"],
        max_tokens=5,
        min_audio_frames=frames,
        max_audio_frames=frames,
    )
    message = want["choices"][0]["message"]
    assert transcript == message["audio"]["transcript"]
    got, ref = np.frombuffer(pcm, "<i2").astype(int), np.frombuffer(base64.b64decode(message["audio"]["data"]), "<i2")
    assert np.abs(got - ref).max() <= 1  # (vocoder calls shared with other streams round differently)
    assert done.usage.input_tokens == want["usage"]["prompt_tokens"]
    audio_tokens = want["usage"]["prompt_tokens_details"]["audio_tokens"]
    assert audio_tokens > 0 and done.usage.input_token_details.audio_tokens == audio_tokens
    assert done.usage.input_token_details.text_tokens == done.usage.input_tokens - audio_tokens


def test_server_vad_detects_a_turn_answers_it_and_transcribes_it(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect() as conn:
            await conn.recv()
            vad = {"type": "server_vad", "silence_duration_ms": 300}
            await conn.session.update(
                session={"audio": {"input": {"turn_detection": vad, "transcription": {"model": "qwen3-omni"}}},
                         "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 3, **GREEDY}
            )  # fmt: skip
            await append(conn, quiet(0.6) + speech(1.2) + quiet(0.8))
            events = await until(conn)
            if not any(e.type.endswith("transcription.completed") for e in events):
                events += await until(conn, "conversation.item.input_audio_transcription.completed")
            return events

    events = asyncio.run(talk())
    types = [e.type for e in events]
    start = types.index("input_audio_buffer.speech_started")
    assert types[start : start + 6] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "conversation.item.added", "conversation.item.done", "response.created",
    ]  # fmt: skip
    started, stopped = events[start], events[start + 1]
    assert 600 - 300 - 40 <= started.audio_start_ms <= 600 - 300 + 100  # speech at 600 ms, 300 ms of padding
    assert stopped.audio_end_ms == 1800 + 200  # speech ends at 1800 ms; the turn keeps 200 ms after it
    assert started.item_id == stopped.item_id == events[start + 2].item_id
    done = [e for e in events if e.type == "response.done"][0].response
    assert done.status == "incomplete" and done.usage.output_tokens == 3
    deltas = [e.delta for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    completed = events[types.index("conversation.item.input_audio_transcription.completed")]
    assert completed.item_id == started.item_id and completed.transcript == "".join(deltas) != ""


def long_answer(conn):
    return conn.session.update(
        session={**NO_VAD, "max_output_tokens": 8, "min_audio_frames": 400, "max_audio_frames": 400, **GREEDY}
    )


async def ask(conn, text="tell me a long story"):
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    await conn.response.create()
    return await until(conn, "response.output_audio.delta")


def test_response_cancel_stops_the_answer_and_frees_its_pages(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect() as conn:
            await conn.recv()
            await long_answer(conn)
            await ask(conn)
            await conn.response.cancel()
            events = await until(conn)
            await conn.response.cancel()
            error = await until(conn, "error")
            return events, error[-1]

    events, error = asyncio.run(talk())
    types = [e.type for e in events]
    done = types.index("response.output_audio.done")
    assert all(not t.endswith(".delta") for t in types[done:])
    assert types[done:] == SPOKEN[4:]
    response = events[-1].response
    assert response.status == "cancelled" and response.status_details.reason == "client_cancelled"
    assert response.output[0].status == "incomplete"
    assert error.error.code == "response_cancel_not_active"
    wait_idle(base_url)


def test_barge_in_cancels_the_answer_and_starts_the_next_turn(base_url):
    async def talk():
        async with sdk(base_url).realtime.connect() as conn:
            await conn.recv()
            await long_answer(conn)
            first = await ask(conn)
            vad = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 100}
            await conn.session.update(
                session={"type": "realtime", "audio": {"input": {"turn_detection": vad}}, "max_output_tokens": 2,
                         "min_audio_frames": 3, "max_audio_frames": 3}
            )  # fmt: skip
            await append(conn, speech(0.8) + quiet(0.6))
            events = await until(conn, "response.done")  # the interrupted answer
            events += await until(conn, "response.done")  # the answer to the new turn
            first_done = [e.type for e in events].index("response.done")
            played = len(audio_of(first + events[:first_done])) // 48  # bytes -> ms of PCM16 at 24 kHz
            interrupted = events[first_done].response.output[0]
            await conn.conversation.item.truncate(item_id=interrupted.id, content_index=0, audio_end_ms=played // 2)
            truncated = await until(conn, "conversation.item.truncated")
            return interrupted, events, truncated[-1], played

    interrupted, events, truncated, played = asyncio.run(talk())
    types = [e.type for e in events]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    cancelled = events[types.index("response.done")].response
    assert cancelled.status == "cancelled" and cancelled.status_details.reason == "turn_detected"
    assert interrupted.status == "incomplete" and interrupted.content[0].transcript  # the partial answer is kept
    rest = events[types.index("response.done") + 1 :]
    assert [e.type for e in rest][:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert rest[-1].response.status == "incomplete" and len(audio_of(rest)) == 2 * (SAMPLES_PER_FRAME * 3 - 555)
    assert truncated.audio_end_ms == played // 2 and truncated.item_id == interrupted.id
    wait_idle(base_url)


async def raw_session(base_url: str, **headers):
    url = base_url.replace("http", "ws", 1) + "/v1/realtime"
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}", **headers})
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def next_of(ws, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if event["type"] == kind:
            return event


BAD_EVENTS = [
    ("{not json", "invalid_json", None),
    ({"type": "session.dance"}, "invalid_value", "type"),
    ({"type": ["session.update"]}, "invalid_value", "type"),
    ([1, 2], "invalid_type", None),
    ({"type": "input_audio_buffer.append", "audio": "%%%not base64"}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(100_000)).decode()}, "audio_too_large",
     "audio"),
    ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}},
     "unsupported_value", "session.audio.input.format"),
    ({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}, "unsupported_value",
     "session.input_audio_format"),
    ({"type": "session.update", "session": {"audio": {"output": {"voice": "nobody"}}}}, "invalid_value",
     "session.audio.output.voice"),
    ({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}}, "invalid_value",
     "session.tools[0].type"),
    ({"type": "session.update", "session": {"temperature": "hot"}}, "invalid_type", "session.temperature"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
    ({"type": "response.cancel"}, "response_cancel_not_active", "response_id"),
    ({"type": "response.create"}, "conversation_empty", None),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": []}},
     "invalid_value", "item.content"),
    ({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 1},
     "item_not_found", "item_id"),
]  # fmt: skip


def test_bad_events_get_error_events_and_the_session_goes_on(base_url):
    async def talk():
        ws = await raw_session(base_url)
        errors = []
        for i, (event, _, _) in enumerate(BAD_EVENTS):
            if not isinstance(event, str):
                event = json.dumps({**event, "event_id": f"evt_{i}"} if isinstance(event, dict) else event)
            await ws.send(event)
            errors.append(await next_of(ws, "error"))
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {**NO_VAD, "output_modalities": ["text"], "max_output_tokens": 2}}
            )
        )
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "still there?"}],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        done = await next_of(ws, "response.done")
        await ws.close()
        return errors, done

    errors, done = asyncio.run(talk())
    for i, ((_, code, param), error) in enumerate(zip(BAD_EVENTS, errors, strict=True)):
        assert error["error"]["code"] == code and error["error"]["param"] == param, (i, error)
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
        assert error["error"]["event_id"] == (f"evt_{i}" if isinstance(BAD_EVENTS[i][0], dict) else None)
    assert done["response"]["status"] == "incomplete" and done["response"]["usage"]["output_tokens"] == 2
    assert urllib.request.urlopen(f"{base_url}/health").status == 200


def test_a_client_that_vanishes_mid_answer_frees_its_pages(base_url):
    async def vanish():
        ws = await raw_session(base_url)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        **NO_VAD,
                        "max_output_tokens": 64,
                        "min_audio_frames": 400,
                        "max_audio_frames": 400,
                        **GREEDY,
                    },
                }
            )
        )
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        await next_of(ws, "response.output_audio.delta")
        ws.transport.abort()  # no close frame: the TCP connection just ends

    asyncio.run(vanish())
    text = wait_idle(base_url)
    assert 'omniwalk_http_responses_total{route="/v1/realtime",status="101"}' in text


def test_auth_limits_and_the_beta_dialect(base_url):
    wait_idle(base_url)  # (no session of an earlier test still open: the limit counts them)

    async def check():
        url = base_url.replace("http", "ws", 1) + "/v1/realtime"
        with pytest.raises(websockets.InvalidStatus) as no_key:
            await websockets.connect(url)
        # pipecat's way: OpenAI's model in the URL, served by the one model
        async with websockets.connect(
            url + "?model=gpt-realtime-2025-08-28", additional_headers={"Authorization": f"Bearer {KEY}"}
        ) as pipecat:
            other_model = json.loads(await pipecat.recv())
        # a browser's way: the key as a subprotocol (it cannot set headers)
        browser = await websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])
        assert browser.subprotocol == "realtime" and json.loads(await browser.recv())["type"] == "session.created"
        others = [await raw_session(base_url) for _ in range(2)]
        with pytest.raises(websockets.InvalidStatus) as full:
            await websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"})
        for ws in [browser, *others]:
            await ws.close()
        async with sdk(base_url).beta.realtime.connect(model="qwen3-omni") as conn:
            created = await conn.recv()
            await conn.session.update(
                session={
                    "modalities": ["text"],
                    "turn_detection": None,
                    "voice": "ethan",
                    "max_response_output_tokens": 2,
                    **GREEDY,
                }
            )
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            )
            await conn.response.create()
            events = await until(conn)
        return no_key.value.response, other_model, full.value.response, created, events

    no_key, other_model, full, created, events = asyncio.run(check())
    assert no_key.status_code == 401 and json.loads(no_key.body)["error"]["code"] == "invalid_api_key"
    assert other_model["type"] == "session.created" and other_model["session"]["model"] == "qwen3-omni"
    assert full.status_code == 429 and json.loads(full.body)["error"]["code"] == "session_limit_reached"
    assert created.session.modalities == ["text", "audio"] and created.session.input_audio_format == "pcm16"
    types = [e.type for e in events]
    assert "conversation.item.created" in types and "response.text.delta" in types and "response.text.done" in types
    assert "conversation.item.done" not in types and "response.output_text.delta" not in types
    assert events[-1].response.usage.output_tokens == 2


CHROMIUM = shutil.which("chromium")  # Debian's (.ci/run installs it)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_talk_page_in_headless_chromium(base_url, tmp_path):
    """The page at / with a fake microphone playing a WAV: a turn is detected, the answer's audio
    reaches the page's output node, both transcripts appear."""
    from playwright.sync_api import sync_playwright

    rate, noise = 48000, np.random.default_rng(0)
    wave = np.concatenate([0.002 * noise.standard_normal(rate), speech_like(1.5, 1, rate), np.zeros(3 * rate)])
    soundfile.write(tmp_path / "mic.wav", wave.astype(np.float32), rate, subtype="PCM_16")
    flags = [
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={tmp_path / 'mic.wav'}%noloop",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 480})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base_url}/")
            page.evaluate("talkSessionExtras = {max_output_tokens: 4, min_audio_frames: 12, max_audio_frames: 12}")
            page.fill("#api-key", KEY)
            page.click("#connect")
            page.wait_for_function(
                "talkStats.responsesDone >= 1 && talkStats.userTranscripts.length >= 1"
                " && talkStats.playedSamples >= 12 * 1920 - 555",
                timeout=120_000,
            )
            stats = page.evaluate("talkStats")
            user = page.inner_text(".turn.user .text")
            assistant = page.inner_text(".turn.assistant .text")
            page.screenshot(path=tmp_path / "talk.png")
            page.click("#disconnect")
            page.wait_for_function("!talkStats.connected", timeout=30_000)
            buttons = page.evaluate("[...document.querySelectorAll('button')].map((b) => [b.id, b.disabled])")
        finally:
            browser.close()
    assert not errors and not stats["errors"], (errors, stats["errors"])
    assert stats["speechStarted"] >= 1 and stats["speechStopped"] >= 1 and stats["audioDeltas"] >= 1
    assert stats["nonZeroSamples"] > 0  # the answer's samples reached the page's output node
    assert user.strip() and user == stats["userTranscripts"][0]
    assert assistant.strip() and assistant == stats["assistantTranscripts"][0]
    assert dict(buttons) == {"connect": False, "disconnect": True, "talk": True, "stop": True}
    wait_idle(base_url)  # the session ended on the server (omniwalk_realtime_sessions 0)
