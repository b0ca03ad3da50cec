"""The HTTP server as users run it: `omniwalk serve` in a subprocess, the official `openai` client.

The engine process + async client: the concurrent workload equals in-process runs alone."""

import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import time
import urllib.request

import httpx
import numpy as np
import openai
import pytest
import soundfile
import zmq
import zmq.asyncio
from helpers.live_server import launch, png_data_url, server
from helpers.qwen3_omni import AUDIO, IMAGE, alone, checkpoint, make_request, walk_omni, wav_data_url, workload

from omniwalk.serve.engine_client import EngineClient, EngineRequestError
from omniwalk.serve.wire import Abort, Add, Failed, Finished, pack, unpack

SPEECH = {"talker_temperature": 0.0, "code_predictor_temperature": 0.0, "min_audio_frames": 12, "max_audio_frames": 12}
GREEDY = {"temperature": 0.0, **SPEECH}


@pytest.fixture(scope="module")
def base_url():
    with server() as base:
        yield base


@pytest.fixture
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def test_text_chat(client):
    r = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "hello world"}],
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 10


def test_usage_counts_the_prompt_tokens_taken_from_prefix_pages(client):
    """A second chat with the same long system prompt takes its full pages (page size 16 here) from the first's."""
    system = {"role": "system", "content": "You answer in one word. " * 12}
    usages = [
        client.chat.completions.create(
            model="qwen3-omni", messages=[system, {"role": "user", "content": question}], max_tokens=2
        ).usage
        for question in ("first question", "second question")
    ]
    first, second = (u.prompt_tokens_details for u in usages)
    assert first.cached_tokens == 0 and first.audio_tokens == 0
    assert second.cached_tokens >= 32 and second.cached_tokens % 16 == 0, second
    assert second.cached_tokens < usages[1].prompt_tokens


def test_a_conversations_recording_is_taken_from_prefix_pages_by_its_next_turn(client):
    """Turn 2 of a chat whose first turn held a recording takes every full page of turn 1's prompt
    (the recording inside: its digest, made in the HTTP process, crossed the wire); the same history
    with another recording takes only the pages before it."""

    def user(seconds: float, seed: int) -> dict:
        wave = (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)
        data = wav_data_url(wave).split(",", 1)[1]
        return {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}

    def usage(messages: list[dict]):
        return client.chat.completions.create(model="qwen3-omni", messages=messages, max_tokens=2).usage

    first = usage([user(1.0, 5)])
    history = [{"role": "assistant", "content": "Yes."}, {"role": "user", "content": "And then?"}]
    second, other = usage([user(1.0, 5), *history]), usage([user(1.0, 6), *history])
    assert first.prompt_tokens_details.audio_tokens > 0
    taken = second.prompt_tokens_details.cached_tokens
    assert taken == 16 * ((first.prompt_tokens - 1) // 16)  # (page size 16)
    assert other.prompt_tokens_details.cached_tokens < taken  # (the recording starts before the last page taken)


def test_audio_and_image_in_text_and_speech_out(client):
    b64_wav = wav_data_url(AUDIO).split(",", 1)[1]
    content = [
        {"type": "input_audio", "input_audio": {"data": b64_wav, "format": "wav"}},
        {"type": "image_url", "image_url": {"url": png_data_url(IMAGE)}},
        {"type": "text", "text": "what is it"},
    ]
    r = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "user", "content": content}],
        max_tokens=5,
        modalities=["text", "audio"],
        audio={"voice": "chelsie", "format": "wav"},
        extra_body=SPEECH,
    )
    message = r.choices[0].message
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000 and len(samples) == 1920 * 12 - 555  # the frames generated, exactly
    # OpenAI's shape: with audio output the text is the audio's transcript only
    assert message.content is None and message.audio.transcript and message.audio.id and message.audio.expires_at
    assert r.usage.prompt_tokens > 40  # the audio and image placeholders count


def test_streamed_pcm_equals_the_non_streaming_audio(client):
    request = dict(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=6,
        modalities=["text", "audio"],
        extra_body={**GREEDY, "ignore_eos": True},
    )
    whole = client.chat.completions.create(audio={"voice": "aiden", "format": "pcm16"}, **request)
    pcm, text, transcript, usage = [], [], [], None
    stream = client.chat.completions.create(
        audio={"voice": "aiden", "format": "pcm16"}, stream=True, stream_options={"include_usage": True}, **request
    )
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            audio = getattr(choice.delta, "audio", None)
            pcm.append(base64.b64decode(getattr(audio, "data", None) or ""))
            transcript.append(getattr(audio, "transcript", None) or "")
    assert b"".join(pcm) == base64.b64decode(whole.choices[0].message.audio.data)
    assert "".join(text) == "" and "".join(transcript) == whole.choices[0].message.audio.transcript
    assert usage.completion_tokens == 6


def test_audio_speech_endpoint(client):
    r = client.audio.speech.create(
        model="qwen3-omni", input="good morning", voice="ethan", response_format="flac", extra_body=SPEECH
    )
    samples, rate = soundfile.read(io.BytesIO(r.content))
    assert rate == 24000 and len(samples) == 1920 * 12 - 555
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="qwen3-omni", input="hi", voice="ethan", speed=1.5)
    assert e.value.body["param"] == "speed" and e.value.body["code"] == "unsupported_value"


def post(base_url: str, body, headers=None, raw: bytes | None = None) -> httpx.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **(headers or {})}  # (JSON routes require the type)
    return httpx.post(f"{base_url}/v1/chat/completions", content=data, headers=headers, timeout=60)


USER = [{"role": "user", "content": "hi"}]
BAD = [
    (None, b"{not json", 400, "not valid JSON"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, None, 400, "unknown content type"),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%"}}]}]},
        None,
        400,
        "base64",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]},
        None,
        400,
        "audio",
    ),
    ({"messages": USER, "max_tokens": 10**7}, None, 400, "exceeds"),
    ({"messages": USER, "modalities": ["text", "audio"], "audio": {"voice": "nobody"}}, None, 400, "unknown voice"),
    ({"messages": USER, "modalities": ["text", "audio"], "audio": {"format": "ogg-vorbis"}}, None, 400, "format"),
    ({"messages": USER, "modalities": ["video"]}, None, 400, "modalities"),
    ({"messages": USER, "model": "gpt-9"}, None, 404, "does not exist"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
        None,
        400,
        "data: URL",
    ),
]


@pytest.mark.parametrize("body, raw, status, message", BAD)
def test_errors_have_openai_bodies(base_url, body, raw, status, message):
    r = post(base_url, body, raw=raw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message.lower() in error["message"].lower() and error["type"] == "invalid_request_error"
    assert error["code"] is None or isinstance(error["code"], str)
    assert urllib.request.urlopen(f"{base_url}/health").status == 200


def test_api_key_and_body_limit_and_queue_full():
    with server("--api-key", "sekret", "--max-body-bytes", "2000", "--max-requests", "1") as base:
        assert post(base, {"messages": USER}).status_code == 401
        assert post(base, {"messages": USER}, {"Authorization": "Bearer wrong"}).status_code == 401
        ok = {"Authorization": "Bearer sekret"}
        assert post(base, {"messages": USER, "max_tokens": 2}, ok).status_code == 200
        big = post(base, {"messages": [{"role": "user", "content": "x" * 5000}]}, ok)
        assert big.status_code == 413 and "exceeds" in big.json()["error"]["message"]
        assert post(base, {"messages": USER}, ok, raw=iter([b"x" * 1500] * 2)).status_code == 413  # no Content-Length

        async def two():
            async with httpx.AsyncClient(timeout=600) as h:
                body = {"messages": USER, "max_tokens": 1500, "ignore_eos": True}
                first = asyncio.create_task(h.post(f"{base}/v1/chat/completions", json=body, headers=ok))
                running = 'omniwalk_engine{quantity="requests",replica="0",stage="engine"} 1.0'
                while running not in (await h.get(f"{base}/metrics", headers=ok)).text:  # the first is in the engine
                    assert not first.done(), first.result()
                    await asyncio.sleep(0.05)
                second = await h.post(f"{base}/v1/chat/completions", json=body, headers=ok)
                first_running = not first.done()
                first.cancel()  # (1500 tokens take minutes on a busy 2-core machine: hang up instead)
                return first_running, second

        first_running, second = asyncio.run(two())
        assert first_running and second.status_code == 429 and second.headers["retry-after"] == "1"


def test_concurrent_streams_with_disconnects(base_url, client):
    prompts = [f"tell me about the world {i}" for i in range(16)]

    def request(i):
        return dict(
            model="qwen3-omni",
            messages=[{"role": "user", "content": prompts[i]}],
            max_tokens=8 + i % 5,
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "pcm16"},
            extra_body={**GREEDY, "ignore_eos": True},
        )

    before = urllib.request.urlopen(f"{base_url}/metrics").read().decode()
    expected = {i: client.chat.completions.create(**request(i)) for i in range(0, 16, 3)}

    async def one(i, a):
        pcm, text = [], []
        stream = await a.chat.completions.create(stream=True, **request(i))
        async for chunk in stream:
            for choice in chunk.choices:
                audio = getattr(choice.delta, "audio", None)
                text.append(getattr(audio, "transcript", None) or "")
                pcm.append(base64.b64decode(getattr(audio, "data", None) or ""))
                if i % 4 == 1 and len(text) >= 3:  # a quarter of the clients hang up mid-stream
                    await stream.close()
                    return None
        return b"".join(pcm), "".join(text)

    async def run_all():
        a = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(i, a) for i in range(16)))

    results = asyncio.run(run_all())
    for i in range(16):
        if i % 4 == 1:
            assert results[i] is None
        elif i in expected:
            got = np.frombuffer(results[i][0], "<i2").astype(int)
            want = np.frombuffer(base64.b64decode(expected[i].choices[0].message.audio.data), "<i2").astype(int)
            # chunks of concurrent requests share vocoder calls: equal up to PCM16 rounding
            assert got.shape == want.shape and np.abs(got - want).max() <= 1
            assert results[i][1] == expected[i].choices[0].message.audio.transcript
    assert urllib.request.urlopen(f"{base_url}/health").status == 200
    deadline = time.monotonic() + 30
    while True:  # aborted requests leave the engine within a step; stats arrive asynchronously
        metrics = urllib.request.urlopen(f"{base_url}/metrics").read().decode()
        idle = 'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="thinker"} 0.0' in metrics
        idle &= 'omniwalk_engine{quantity="kv_pages_used",replica="0",stage="talker"} 0.0' in metrics
        idle &= 'omniwalk_engine{quantity="requests",replica="0",stage="engine"} 0.0' in metrics
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert idle, metrics
    assert "omniwalk_requests_in_flight 0.0" in metrics
    assert 'omniwalk_requests_total{status="length"}' in metrics
    assert 'omniwalk_http_responses_total{route="/v1/chat/completions",status="499"} 4.0' in metrics
    # every request with output observed once per phase of its time to first output, as many as its TTFT
    firsts = re.search(r"^omniwalk_time_to_first_token_seconds_count (\S+)$", metrics, re.M).group(1)
    for phase in ("inbox", "add", "engine", "outbox"):
        assert f'omniwalk_first_output_phase_seconds_count{{phase="{phase}"}} {firsts}' in metrics, phase
    # every answer that ended (by length: the hung-up ones do not) started once in each stage of its walk
    ended = _sample(metrics, 'omniwalk_requests_total{status="length"}') - _sample(
        before, 'omniwalk_requests_total{status="length"}'
    )
    assert ended == len(expected) + 12  # the collected answers and the streams not hung up
    for stage in ("thinker", "talker", "vocoder"):
        series = f'omniwalk_stage_start_seconds_count{{stage="{stage}"}}'
        assert _sample(metrics, series) - _sample(before, series) == ended, stage


def _sample(metrics: str, series: str) -> float:
    """A Prometheus series' value in ``metrics`` (0 where it is absent)."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_an_engine_failure_is_a_500_for_that_request_only():
    with server(entry=("-m", "tests.helpers.fault_server")) as base:

        async def both():
            async with httpx.AsyncClient(timeout=60) as h:
                url = f"{base}/v1/chat/completions"
                good = {"messages": USER, "max_tokens": 30, "ignore_eos": True, "temperature": 0.0}
                bad = {**good, "max_tokens": 13}
                return await asyncio.gather(h.post(url, json=good), h.post(url, json=bad), h.post(url, json=good))

        good, bad, again = asyncio.run(both())
        assert bad.status_code == 500, bad.text
        error = bad.json()["error"]
        assert error["type"] == "server_error" and "injected engine fault" in error["message"]
        assert "request id" in error["message"]
        assert good.status_code == again.status_code == 200
        assert good.json()["usage"]["completion_tokens"] == 30
        assert good.json()["choices"][0]["message"] == again.json()["choices"][0]["message"]
        assert urllib.request.urlopen(f"{base}/health").status == 200


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_stop_the_server_and_its_engine_cleanly(how):
    """A terminal's Ctrl-C (SIGINT to the whole process group) or a SIGTERM to the server: both
    processes exit, with status 0, "stopped" and no traceback."""
    proc, base = launch()
    while json.loads(urllib.request.urlopen(f"{base}/health", timeout=2).read())["status"] != "ready":
        time.sleep(0.2)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    assert "Traceback" not in output and output.rstrip().endswith("stopped"), output
    deadline = time.monotonic() + 10  # the whole group goes: the engine process too
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    left = subprocess.run(["ps", "-o", "pid,args", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"processes left in the server's group:\n{left}")


async def collect(client: EngineClient, request: dict) -> dict:
    text, audio = [], []
    async for event in client.generate(request):
        if isinstance(event, Finished):
            return {"deltas": text, "chunks": audio, **event.output}
        (text if event.kind == "text" else audio).append(event.data)


async def scenario():
    client = EngineClient(model=checkpoint("tiny"), vocoder_max_batch=1)
    try:
        await client.start()
        requests = workload()
        outs = await asyncio.gather(*(collect(client, r) for r in requests))
        bad = await asyncio.gather(
            collect(client, {"messages": [{"role": "user", "content": [{"type": "file"}]}]}),
            collect(client, {**requests[4], "request_id": "bad-voice", "voice": "nobody"}),
            return_exceptions=True,
        )
        after = await collect(client, {**requests[0], "request_id": "after"})
        return requests, outs, bad, after, client.is_alive
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_engine_process_matches_in_process_runs_alone():
    requests, outs, bad, after, alive = asyncio.run(scenario())
    for i, (request, out) in enumerate(zip(requests, outs, strict=True)):
        ref = alone(i)
        assert out["request_id"] == request["request_id"]
        assert out["token_ids"] == ref.token_ids and out["text"] == ref.text == "".join(out["deltas"])
        assert out["finish_reason"] == ref.finish_reason
        if ref.codes is not None:
            assert np.array_equal(out["codes"], ref.codes.numpy())
            streamed = np.concatenate(out["chunks"])
            assert np.array_equal(streamed, out["audio"])
            assert np.array_equal(out["audio"], ref.audio.numpy())  # vocoder_max_batch=1: bit for bit
    assert all(isinstance(e, EngineRequestError) and e.bad_request for e in bad)
    assert "unknown content type" in str(bad[0]) and "unknown voice" in str(bad[1])
    assert after["token_ids"] == alone(0).token_ids and alive


def held_stream(events, interval: int) -> list[tuple[str, object]]:
    """An in-process event stream as the engine process sends it with ``stream_interval``: text pieces
    joined ``interval`` at a time, a request's first output and anything before audio or the end at once."""
    out, held = [], []
    for event in events:
        if event.kind == "text":
            held.append(event.data)
            if len(held) < interval and out:
                continue
        if held:
            out.append(("text", "".join(held)))
            held = []
        if event.kind == "audio":
            out.append(("audio", event.data.numpy()))
    return out + ([("text", "".join(held))] if held else [])


async def streamed(client: EngineClient, request: dict) -> list[tuple[str, object]]:
    return [(e.kind, e.data) async for e in client.generate(request) if not isinstance(e, Finished)]


async def sent_after_close(client: EngineClient, request: dict) -> list:
    """The messages ``client`` sends the engine for ``request`` when its consumer closes the stream at its
    Finished (as a server's response does once it has the end), without asking for more."""
    sent, send = [], client._push.send
    client._push.send = lambda data, *args, **kwargs: (sent.extend(unpack(data)), send(data, *args, **kwargs))[1]
    events = client.generate(request)
    try:
        async for event in events:
            if isinstance(event, Finished):
                break
        await events.aclose()
    finally:
        client._push.send = send
    return sent


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_stream_interval_sends_text_pieces_together_and_the_first_at_once():
    """``stream_interval=4``: the deltas of a text and a speech request (one at a time) are the in-process
    stream's pieces, 4 joined per delta, the first alone, held text sent before each audio chunk."""
    requests = [make_request(i, path) for i, path in ((20, "t2t"), (5, "s2s"))]
    requests[0]["max_tokens"] = 23

    async def run():
        client = EngineClient(model=checkpoint("tiny"), vocoder_max_batch=1, stream_interval=4)
        try:
            await client.start()
            got = [await streamed(client, request) for request in requests]
            return got, await sent_after_close(client, {**requests[0], "request_id": "closed-at-finished"})
        finally:
            client.close()

    got, sent = asyncio.run(run())
    assert [type(m).__name__ for m in sent] == ["Add"]  # (a consumer that closes it at its Finished aborts nothing)
    for request, deltas in zip(requests, got, strict=True):
        events = list(walk_omni(vocoder_max_batch=1).stream(request))
        want = held_stream(events, 4)
        assert [kind for kind, _ in deltas] == [kind for kind, _ in want]
        for (kind, data), (_, expected) in zip(deltas, want, strict=True):
            assert np.array_equal(data, expected) if kind == "audio" else data == expected
        texts = [data for kind, data in deltas if kind == "text"]
        assert len(texts) < sum(e.kind == "text" for e in events)  # (pieces were joined)
    assert len(got[0]) == 1 + -(-(23 - 1) // 4)  # (a text piece a token here)


async def remote_run(
    dealer, client: EngineClient, request: dict, abort_after: int | None = None, other=None, open_late=False
) -> list:
    """``request`` sent by a remote client (``dealer``), followed from the engine's own ``client``: the
    messages the remote client got, once ``client`` saw it end. With ``abort_after``: after its first
    message another remote client (``other``) sends an Abort of it, and after ``abort_after`` messages
    ``dealer`` does. ``open_late``: ``client`` follows it only once it has ended (as a Ray replica whose
    call comes after the ingress sent the request ahead)."""
    if not open_late:
        client.open_remote(request["request_id"])
    await dealer.send(pack(Add(request)))
    got = []
    while not got or not isinstance(got[-1], (Finished, Failed)):
        got.extend(unpack(await asyncio.wait_for(dealer.recv(), 30)))  # (a frame: a step's messages)
        if other is not None:
            await other.send(pack(Abort(request["request_id"])))  # (not its request: ignored)
            other = None
        if abort_after is not None and len(got) >= abort_after:
            await dealer.send(pack(Abort(request["request_id"])))
            abort_after = None
    if open_late:
        await asyncio.sleep(0.5)  # (the owner's Ended comes after the remote client's Finished)
        client.open_remote(request["request_id"])
    await asyncio.wait_for(client.ended(request["request_id"]), 30)
    return got


async def remote_scenario():
    client = EngineClient(data_host="127.0.0.1", model=checkpoint("tiny"))
    ctx = zmq.asyncio.Context()
    try:
        await client.start()
        dealer, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        for socket in (dealer, other):
            socket.connect(client.endpoint)
        request = {**workload()[0], "request_id": "remote"}
        done = await remote_run(dealer, client, request)
        unknown = [{"role": "user", "content": [{"type": "file"}]}]
        bad = await remote_run(dealer, client, {"request_id": "remote-bad", "messages": unknown})
        long = {**request, "request_id": "remote-long", "max_tokens": 500, "ignore_eos": True}
        aborted = await remote_run(dealer, client, long, abort_after=12, other=other)
        late = await remote_run(dealer, client, {**request, "request_id": "remote-late"}, open_late=True)
        assert late[-1].output["token_ids"] == done[-1].output["token_ids"]
        return client.endpoint, done, bad, aborted, client.num_unfinished, await other.poll(200)
    finally:
        ctx.destroy(linger=0)
        client.close()


def test_a_remote_client_gets_its_requests_events_and_the_engines_own_client_their_ends():
    """The engine's ``data_host`` socket (how Ray ingresses reach an engine replica): a remote client's
    request runs as the owner's would, its events go to that client alone, the owner hears of its end
    (``ended``), a bad request fails alone, the remote client's Abort stops its own request only, and the
    owner follows a request that ended before it opened it."""
    endpoint, done, bad, aborted, unfinished, other_got = asyncio.run(remote_scenario())
    assert endpoint.startswith("tcp://127.0.0.1:")
    ref = alone(0)
    assert isinstance(done[-1], Finished) and done[-1].output["token_ids"] == ref.token_ids
    assert "".join(m.data for m in done[:-1] if m.kind == "text") == ref.text
    assert [type(m) for m in bad] == [Failed] and "unknown content type" in bad[0].error and bad[0].bad_request
    assert isinstance(aborted[-1], Finished) and aborted[-1].output["finish_reason"] == "abort"
    assert 12 <= len(aborted) - 1 < 500  # (the other client's Abort, sent after the first delta, changed nothing)
    assert unfinished == 0 and not other_got  # (nothing was sent to the client that sent no request)
