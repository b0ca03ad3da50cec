"""The front door against a live server: slow headers and bodies get 408 and are closed, a body cut
short is a 499 without a traceback, the connection cap answers 503, the API key guards /v1/models and
/metrics (read from a file), /health shows no process id, a cross-origin WebSocket handshake is
refused and a JSON route refuses a body that is not ``application/json``."""

import asyncio
import json
import os
import socket
import time

import httpx
import pytest
import websockets
from helpers.live_server import launch

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
