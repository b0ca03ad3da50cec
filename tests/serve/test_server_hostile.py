"""Hostile and unsupported bodies against a live server: each is a 4xx in OpenAI's shape naming the
field, and the client's next request on the same keep-alive connection succeeds.

Media that expands far beyond its size, and media abandoned by its client, against a live server.

Small files that decode to gigabytes are refused from their headers (400 naming the budget) without
growing the HTTP process; decoding whose client hung up stops at its next frame (a 499, counted in
``omniwalk_media_cancelled_total``) and frees the pool for the request behind it.

The front door against a live server: slow headers and bodies get 408 and are closed, a body cut
short is a 499 without a traceback, the connection cap answers 503, the API key guards /v1/models and
/metrics (read from a file), /health shows no process id, a cross-origin WebSocket handshake is
refused and a JSON route refuses a body that is not ``application/json``."""

import asyncio
import base64
import http.client
import json
import os
import socket
import threading
import time
import urllib.request

import httpx
import numpy as np
import openai
import pytest
import websockets
from helpers.live_server import (
    HOSTILE,
    RAW,
    USER,
    launch,
    media_body,
    media_bombs,
    metric,
    rss_mb,
    slow_video,
    solid_video,
)


@pytest.fixture(scope="module")
def served():
    proc, base = launch(entry=("-m", "tests.helpers.fault_server"))
    yield proc, base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def live(served):
    return served[1]


class Connection:
    """One keep-alive HTTP/1.1 connection; ``port`` tells whether the socket is still the first one."""

    def __init__(self, base: str):
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def post(self, path: str, body: bytes, content_type="application/json") -> tuple[int, dict, dict]:
        self.conn.request("POST", path, body, {"content-type": content_type})
        r = self.conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}, dict(r.headers)

    def get(self, path: str) -> tuple[int, dict]:
        self.conn.request("GET", path)
        r = self.conn.getresponse()
        return r.status, json.loads(r.read())

    @property
    def port(self):
        return self.conn.sock.getsockname()[1] if self.conn.sock else None


def _valid(c: Connection) -> None:
    port = c.port
    status, body, _ = c.post("/v1/chat/completions", json.dumps({"messages": USER, "max_tokens": 1}).encode())
    assert status == 200, body
    assert port is None or c.port == port  # the same connection served it


@pytest.mark.parametrize("body, status, param, code", HOSTILE + RAW)
def test_hostile_bodies_are_4xx_and_the_connection_stays_usable(live, body, status, param, code):
    c = Connection(live)
    _valid(c)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, reply, headers = c.post("/v1/chat/completions", raw)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["code"] == code, error
    assert "0x" not in error["message"] and "Errno" not in error["message"]  # no internals
    assert headers["x-request-id"].startswith("req_")
    _valid(c)


def test_speech_bodies(live):
    c = Connection(live)
    for body, param in [
        ({"input": "hi", "voice": 5}, "voice"),
        ({"input": ""}, "input"),
        ({"input": "hi", "voice": "nobody"}, "voice"),
        ({"input": "hi", "speed": 2.0}, "speed"),
        ({"input": "hi", "response_format": "aac"}, "response_format"),
        ({"input": "hi", "instructions": "whisper"}, "instructions"),
    ]:
        status, reply, _ = c.post("/v1/audio/speech", json.dumps(body).encode())
        assert status == 400 and reply["error"]["param"] == param, reply
    _valid(c)


def test_unexpected_fault_is_a_json_500_with_a_request_id(live):
    c = Connection(live)
    body = {"messages": USER, "max_tokens": 7, "ignore_eos": True}  # tests/helpers/fault_server.py raises on 7 tokens
    status, reply, headers = c.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 500 and reply["error"]["type"] == "server_error"
    assert headers["x-request-id"] in reply["error"]["message"]
    _valid(c)


def test_404_405_and_models(live):
    c = Connection(live)
    status, reply = c.get("/v1/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"
    status, reply, _ = c.post("/v1/models", b"{}")
    assert status == 405 and reply["error"]["code"] == "method_not_allowed"
    status, reply = c.get("/v1/models/qwen3-omni")
    assert status == 200 and reply["id"] == "qwen3-omni" and reply["object"] == "model"
    status, reply = c.get("/v1/models/gpt-9")
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    _valid(c)


def test_developer_role_and_assistant_audio_by_id(live):
    client = openai.OpenAI(base_url=f"{live}/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        max_tokens=2,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
        extra_body={"max_audio_frames": 2},
    )
    audio = first.choices[0].message.audio
    assert first.choices[0].message.content is None and audio.id
    second = client.chat.completions.create(
        model="qwen3-omni",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "audio": {"id": audio.id}},
            {"role": "user", "content": "and then?"},
        ],
        max_tokens=2,
    )
    # the assistant turn was read as its transcript: the prompt is longer than without it
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_256_mib_body_is_refused_without_reading_it_into_memory(served):
    proc, live = served
    before = rss_mb(proc.pid)
    c = Connection(live)
    _valid(c)
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * (256 * 2**20) + b'"}]}'
    status, reply, _ = c.post("/v1/chat/completions", body)
    assert status == 413 and reply["error"]["code"] == "body_too_large"
    growth = rss_mb(proc.pid) - before
    print(f"HTTP process RSS growth over a 256 MiB body: {growth:.1f} MB")
    assert growth < 80
    _valid(c)
    metrics = urllib.request.urlopen(f"{live}/metrics").read().decode()
    for status in ("400", "404", "405", "413", "500"):
        assert f'status="{status}"' in metrics


@pytest.fixture(scope="module")
def bomb_served():
    proc, base = launch()  # two media workers (the default)
    yield proc, base
    proc.terminate()
    proc.wait(timeout=30)


def memory_mib(pid: int) -> dict:
    """The process's own VmRSS and VmHWM (peak) in MiB."""
    lines = [line.split() for line in open(f"/proc/{pid}/status") if line.startswith(("VmRSS", "VmHWM"))]
    return {name.rstrip(":"): int(kb) / 1024 for name, kb, _ in lines}


def test_media_bombs_are_refused_from_their_headers(bomb_served):
    proc, base = bomb_served
    bombs = media_bombs()
    print("bomb sizes (bytes):", [len(data) for _, _, data, _ in bombs])
    with httpx.Client(base_url=base, timeout=60) as client:
        warm = client.post("/v1/chat/completions", json=media_body("video", "video/mp4", solid_video(64, 64, 8, 4)))
        assert warm.status_code == 200, warm.text  # (PyAV and the resizer loaded before the baseline)
        before = memory_mib(proc.pid)
        for kind, mime, data, limit in bombs:
            start = time.monotonic()
            reply = client.post("/v1/chat/completions", json=media_body(kind, mime, data))
            took = time.monotonic() - start
            assert reply.status_code == 400, reply.text
            assert limit in reply.json()["error"]["message"], reply.json()
            print(f"{kind} bomb: 400 in {took:.3f} s: {reply.json()['error']['message']}")
            assert took < 1.0
        after = memory_mib(proc.pid)
        growth = after["VmHWM"] - before["VmRSS"]
        print(f"HTTP process memory: {before} -> {after}; peak growth {growth:.1f} MiB")
        assert growth < 100
        valid = client.post("/v1/chat/completions", json=media_body("video", "video/mp4", solid_video(64, 64, 8, 4)))
        assert valid.status_code == 200, valid.text


def test_a_large_body_costs_a_few_times_its_size(bomb_served):
    """A 60 MiB body (base64 that decodes to no audio: a 400) raises the HTTP process's peak RSS by
    about 4x its size (the bytes, their parsed JSON, the decoded base64): the factor the resource
    model in docs/serving.md multiplies ``--max-body-bytes`` by."""
    proc, base = bomb_served
    data = base64.b64encode(np.random.default_rng(0).bytes(45 * 2**20)).decode()
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    body = json.dumps({"messages": [{"role": "user", "content": [part]}], "max_tokens": 1}).encode()
    before = memory_mib(proc.pid)
    reply = httpx.post(
        f"{base}/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=120
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages[0].content[0].input_audio.data"
    growth, size = memory_mib(proc.pid)["VmHWM"] - before["VmRSS"], len(body) / 2**20
    print(f"a {size:.0f} MiB body: HTTP process peak +{growth:.0f} MiB ({growth / size:.1f}x)")
    assert growth < 5 * size


def _abandon(base: str, body: bytes, after_s: float, closed: list) -> None:
    """POST the body on a raw socket, then hang up without reading the answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(after_s)
    closed.append(time.monotonic())


def test_abandoned_videos_stop_decoding_and_free_the_pool(bomb_served):
    _, base = bomb_served
    # seconds of decoding each (``slow_video``), so six of them hold both workers far longer than the test runs
    slow = json.dumps(media_body("video", "video/mp4", slow_video())).encode()
    valid = media_body("video", "video/mp4", solid_video(64, 64, 8, 4))
    start = time.monotonic()
    assert httpx.post(f"{base}/v1/chat/completions", json=valid, timeout=60).status_code == 200
    alone = time.monotonic() - start  # its own service time, on an idle pool
    cancelled = metric(base, "omniwalk_media_cancelled_total", kind="video")
    gone = metric(base, "omniwalk_http_responses_total", route="/v1/chat/completions", status="499")
    closed: list[float] = []
    clients = [threading.Thread(target=_abandon, args=(base, slow, 0.3, closed)) for _ in range(6)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    hung_up = max(closed)
    while metric(base, "omniwalk_media_cancelled_total", kind="video") < cancelled + 6:
        assert time.monotonic() - hung_up < 0.5, "decoding went on after its clients hung up"
        time.sleep(0.02)
    stopped = time.monotonic() - hung_up
    start = time.monotonic()
    reply = httpx.post(f"{base}/v1/chat/completions", json=valid, timeout=60)
    served_in = time.monotonic() - start
    print(f"six abandoned videos stopped {stopped:.3f} s after the last hang-up; the next served in {served_in:.3f} s")
    print(f"(the same request alone: {alone:.3f} s)")
    assert reply.status_code == 200, reply.text
    assert served_in < alone + 1.0  # within 1 s of its turn: nothing of the abandoned work is left ahead of it
    deadline = time.monotonic() + 5  # (the access counts land as each handler returns)
    while metric(base, "omniwalk_http_responses_total", route="/v1/chat/completions", status="499") < gone + 6:
        assert time.monotonic() < deadline, "the abandoned requests were not counted as 499"
        time.sleep(0.05)


KEY = "front-door-key"
HEADER_TIMEOUT_S = BODY_TIMEOUT_S = 3.0  # (slow bytes come every 2 s: the close falls between two)
MAX_CONNECTIONS = 120
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def door_served(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("secret") / "key"
    key_file.write_text(KEY + "\n")
    flags = ["--api-key-file", str(key_file), "--log-level", "info", "--max-connections", str(MAX_CONNECTIONS)]
    flags += ["--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S)]
    flags += ["--allowed-origins", "https://app.example"]
    proc, base = launch(*flags)
    os.set_blocking(proc.stdout.fileno(), False)
    yield proc, base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def base(door_served):
    return door_served[1]


def _log(proc) -> str:
    """The server's output so far (its pipe is non-blocking)."""
    chunks = []
    while True:
        try:
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def test_slowloris_connections_are_closed_within_the_header_timeout_and_others_are_served(base):
    async def slow_client() -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection(*_address(base))
        start, head = time.monotonic(), b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40

        async def drip():
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(2.0)

        dripping = asyncio.create_task(drip())
        try:
            answer = await asyncio.wait_for(reader.read(), HEADER_TIMEOUT_S + 20)  # (until the server closes)
        finally:
            dripping.cancel()
            writer.close()
        return time.monotonic() - start, answer

    async def scenario():
        slow = [asyncio.create_task(slow_client()) for _ in range(100)]
        await asyncio.sleep(0.5)
        async with httpx.AsyncClient(timeout=60) as h:
            models = await h.get(f"{base}/v1/models", headers=AUTH)
            chat = await h.post(f"{base}/v1/chat/completions", json=CHAT, headers=AUTH)
        return await asyncio.gather(*slow), models, chat

    results, models, chat = asyncio.run(scenario())  # (the valid requests come while the 100 slow ones are open)
    assert models.status_code == 200 and chat.status_code == 200, chat.text
    for seconds, answer in results:
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
        assert seconds < HEADER_TIMEOUT_S + 3, seconds  # (generous: a loaded 2-core machine)


def _raw(base: str, head: bytes, body: bytes) -> socket.socket:
    s = socket.create_connection(_address(base), timeout=30)
    s.sendall(head + body)
    return s


def _chat_head(length: int, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {length}\r\n".encode()
        + extra
        + b"\r\n"
    )


def _metric(base: str, needle: str) -> str:
    return next((line for line in httpx.get(f"{base}/metrics", headers=AUTH).text.splitlines() if needle in line), "")


def test_a_body_that_stops_gets_408_and_is_closed(base):
    s = _raw(base, _chat_head(1000), b'{"messages": ')
    start = time.monotonic()
    answer = b""
    while chunk := s.recv(65536):  # (until the server closes)
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert time.monotonic() - start < BODY_TIMEOUT_S + 3


def test_a_body_cut_short_is_a_499_without_a_traceback(door_served):
    proc, base = door_served
    needle = 'omniwalk_http_responses_total{route="/v1/chat/completions",status="499"}'
    before = _metric(base, needle)
    s = _raw(base, _chat_head(1000), b'{"messages": [')
    time.sleep(0.2)
    s.close()  # the client hangs up mid-body
    deadline = time.monotonic() + 10
    while _metric(base, needle) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(base, needle) != before
    log = _log(proc)
    assert '"POST /v1/chat/completions" 499' in log and "Traceback" not in log and " 500 " not in log


def test_connections_beyond_the_cap_get_503(base):
    idle = [socket.create_connection(_address(base)) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        full = httpx.get(f"{base}/health", timeout=10)
    finally:
        for s in idle:
            s.close()
    assert full.status_code == 503
    deadline = time.monotonic() + 10
    while httpx.get(f"{base}/health", timeout=10).status_code != 200:  # (the server sees the closes)
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_the_key_guards_models_and_metrics_and_health_shows_no_pid(base):
    for path in ("/v1/models", "/v1/models/qwen3-omni", "/metrics"):
        refused = httpx.get(f"{base}{path}")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(f"{base}{path}", headers=AUTH).status_code == 200, path
    health = httpx.get(f"{base}/health")
    assert health.status_code == 200 and "pid" not in health.text


def test_json_routes_refuse_other_content_types(base):
    body = json.dumps(CHAT).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**AUTH, **({"content-type": kind} if kind else {})}
        r = httpx.post(f"{base}/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 415, (kind, r.text)
        error = r.json()["error"]
        assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"
    ok = httpx.post(f"{base}/v1/chat/completions", content=body, headers={**AUTH, "content-type": "application/json"})
    assert ok.status_code == 200, ok.text


def test_realtime_checks_the_origin(base):
    url = base.replace("http://", "ws://") + "/v1/realtime"
    auth = {"Authorization": f"Bearer {KEY}"}

    async def handshake(origin: str | None) -> int:
        headers = {**auth, **({"Origin": origin} if origin else {})}
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=30):
                return 101
        except websockets.InvalidStatus as e:
            return e.response.status_code

    assert asyncio.run(handshake("https://evil.example")) == 403
    assert asyncio.run(handshake(base)) == 101  # same origin
    assert asyncio.run(handshake("https://app.example")) == 101  # allow-listed
    assert asyncio.run(handshake(None)) == 101  # an SDK sends none


def test_the_key_comes_from_one_source(tmp_path, monkeypatch):
    from omniwalk.cli import API_KEY_ENV, _api_key
    from omniwalk.config import ServerConfig
    from omniwalk.errors import ConfigError

    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert _api_key(ServerConfig()) is None
    assert _api_key(ServerConfig(api_key_file=str(key_file))) == "from-file"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert _api_key(ServerConfig()) == "from-env"
    with pytest.raises(ConfigError, match="more than once"):
        _api_key(ServerConfig(api_key_file=str(key_file)))
    with pytest.raises(ConfigError, match="cannot read"):
        _api_key(ServerConfig(api_key_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="allowed_origins"):
        ServerConfig(allowed_origins="evil.example")
