"""``--data-parallel 2``: two engine processes behind one server, as the official ``openai`` client
sees them. Requests go to the least loaded replica (affinity off here: which replica holds a
conversation's prefix is the routing policy's test, tests/serve/test_routing.py); a replica whose
process is killed fails the requests it held with a 503 (an OpenAI error body, at once), is reported dead in /health and
/metrics, and the other one keeps serving."""

import asyncio
import json
import os
import signal
import time
import urllib.request

import httpx
import openai
import pytest
from helpers.live_server import engine_pids, launch
from helpers.qwen3_omni import omni

from omniwalk.serve.engine_client import EngineRequestError
from omniwalk.serve.replicas import Replicas

LONG = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000, "ignore_eos": True}
HOLD = {**LONG, "max_tokens": 4001}  # fault server: 20 ms a token at least
GREEDY = {**LONG, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 41, "temperature": 0.0}


def _health(base: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _unfinished(metrics: str) -> dict[str, float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith('omniwalk_engine{quantity="unfinished"'):
            out[line.split('replica="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def _chat(base: str, text: str) -> str:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="qwen3-omni", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    return reply.choices[0].message.content


async def _until(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


def test_two_replicas_serve_route_to_the_least_loaded_and_survive_a_killed_one():
    # the fault server: its requests of 41 and 4001 tokens take at least 20 ms a token (0.8 s, 80 s), so
    # each is seen running in /metrics on a fast machine too; every other request runs as in ``serve``
    proc, base = launch(
        "--data-parallel", "2", "--routing-affinity", "false", entry=("-m", "tests.helpers.fault_server")
    )
    try:
        status, health = _health(base)
        assert status == 200 and health["status"] == "ready", health
        assert [r["status"] for r in health["replicas"]] == ["ready", "ready"]
        pids = engine_pids(proc.pid)
        assert len(set(pids)) == 2 and proc.pid not in pids
        metrics = lambda: httpx.get(f"{base}/metrics").text  # noqa: E731

        async def replica_one_answers():
            async with httpx.AsyncClient(timeout=600) as h:
                post = lambda body: asyncio.create_task(h.post(f"{base}/v1/chat/completions", json=body))  # noqa: E731
                hold = post(HOLD)  # replica 0 (a tie goes to it) holds a request for 80 s or more
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 0.0})
                answer = post(GREEDY)  # so the idle replica 1 takes this one
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 1.0})
                answer = await answer
                hold.cancel()  # (the client hangs up: replica 0 aborts it)
                await _until(lambda: _unfinished(metrics()) == {"0": 0.0, "1": 0.0})
                return answer

        answer = asyncio.run(replica_one_answers())
        # replica 1's answer is the greedy answer Omni gives in process
        ref = omni().generate({k: v for k, v in GREEDY.items() if k != "model"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(ref.token_ids) == 41 and body["choices"][0]["message"]["content"] == ref.text
        assert body["usage"]["completion_tokens"] == 41 and body["usage"]["prompt_tokens"] == len(ref.prompt_token_ids)

        async def kill_replica_one():
            async with httpx.AsyncClient(timeout=120) as h:
                first = asyncio.create_task(h.post(f"{base}/v1/chat/completions", json={**LONG, "max_tokens": 300}))
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 0.0})
                second = asyncio.create_task(h.post(f"{base}/v1/chat/completions", json=LONG))
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 1.0})  # the idle one took it
                os.kill(pids[1], signal.SIGKILL)
                killed = time.monotonic()
                failed = await second
                return failed, time.monotonic() - killed, await first

        failed, seconds, survived = asyncio.run(kill_replica_one())
        assert failed.status_code == 503 and seconds < 5, failed.text
        assert (
            failed.json()["error"]["code"] == "engine_unavailable" and failed.json()["error"]["type"] == "server_error"
        )
        assert survived.status_code == 200 and survived.json()["usage"]["completion_tokens"] == 300, survived.text

        status, health = _health(base)
        assert status == 200 and health["status"] == "degraded", health
        assert [r["status"] for r in health["replicas"]] == ["ready", "engine_dead"]
        assert "exited with code -9" in health["replicas"][1]["reason"]
        text = httpx.get(f"{base}/metrics").text
        assert 'omniwalk_engine{quantity="up",replica="1",stage="replica"} 0.0' in text
        assert 'omniwalk_engine{quantity="up",replica="0",stage="replica"} 1.0' in text
        for i in range(3):  # the live replica takes every new request
            assert isinstance(_chat(base, f"again {i}"), str)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert "replica 1: the engine process exited with code -9; 1 replica(s) serve" in output, output


def test_data_parallel_must_be_positive():
    from omniwalk.config import ServerConfig
    from omniwalk.errors import ConfigError

    with pytest.raises(ConfigError, match="data_parallel must be >= 1"):
        ServerConfig(data_parallel=0)


class FakeReplica:
    """An engine client's adapter calls, in memory; ``refuses`` names the adapters it will not load."""

    def __init__(self, refuses=()):
        self.adapters, self.refuses = [], refuses

    async def adapter_call(self, action: str, name: str, path: str | None = None) -> None:
        if action == "load" and name in self.refuses:
            raise EngineRequestError(f"adapter {name!r}: bad key", "AdapterError", bad_request=True, param="lora_path")
        self.adapters = [*self.adapters, name] if action == "load" else [a for a in self.adapters if a != name]


def test_adapter_calls_reach_every_replica_and_a_refused_load_is_undone_on_all():
    replicas = Replicas.__new__(Replicas)  # (no engine processes: the adapter calls are the clients')
    replicas.clients = [FakeReplica(), FakeReplica(), FakeReplica(refuses=("bad",))]
    asyncio.run(replicas.adapter_call("load", "good", "/adapters/good"))
    assert replicas.adapters == ("good",) and all(c.adapters == ["good"] for c in replicas.clients)
    with pytest.raises(EngineRequestError, match="bad key"):
        asyncio.run(replicas.adapter_call("load", "bad", "/adapters/bad"))
    assert all(c.adapters == ["good"] for c in replicas.clients)  # replicas 0 and 1 unloaded it again
    asyncio.run(replicas.adapter_call("unload", "good"))
    assert replicas.adapters == () and all(c.adapters == [] for c in replicas.clients)
