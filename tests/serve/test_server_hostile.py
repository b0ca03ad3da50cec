"""Hostile and unsupported bodies against a live server: each is a 4xx in OpenAI's shape naming the
field, and the client's next request on the same keep-alive connection succeeds."""

import http.client
import json
import urllib.request

import openai
import pytest
from helpers.live_server import HOSTILE, RAW, USER, launch, rss_mb


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
    for body, param in [({"input": "hi", "voice": 5}, "voice"), ({"input": ""}, "input"),
                        ({"input": "hi", "voice": "nobody"}, "voice"), ({"input": "hi", "speed": 2.0}, "speed"),
                        ({"input": "hi", "response_format": "aac"}, "response_format"),
                        ({"input": "hi", "instructions": "whisper"}, "instructions")]:  # fmt: skip
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
