"""``--data-parallel 2``: two engine processes behind one server, as the official ``openai`` client
sees them. Requests go to the least loaded replica; a replica whose process is killed fails the
requests it held with a 503 (an OpenAI error body, at once), is reported dead in /health and
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
from helpers.live_server import launch
from helpers.qwen3_omni import omni

LONG = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000, "ignore_eos": True}
# long enough to be seen running on its replica; greedy, so every replica must give Omni's answer
GREEDY = {**LONG, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 300, "temperature": 0.0}


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
    proc, base = launch("--data-parallel", "2")
    try:
        status, health = _health(base)
        assert status == 200 and health["status"] == "ready", health
        assert [r["status"] for r in health["replicas"]] == ["ready", "ready"]
        pids = [r["pid"] for r in health["replicas"]]
        assert len(set(pids)) == 2 and proc.pid not in pids

        async def scenario():
            metrics = lambda: httpx.get(f"{base}/metrics").text  # noqa: E731
            async with httpx.AsyncClient(timeout=120) as h:
                post = lambda body: asyncio.create_task(h.post(f"{base}/v1/chat/completions", json=body))  # noqa: E731
                on_zero = post(GREEDY)
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 0.0})
                on_one = post(GREEDY)  # replica 0 holds a request, so the idle replica 1 takes this one
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 1.0})
                answers = await on_zero, await on_one
                await _until(lambda: _unfinished(metrics()) == {"0": 0.0, "1": 0.0})
                first = post({**LONG, "max_tokens": 300})
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 0.0})
                second = post(LONG)
                await _until(lambda: _unfinished(metrics()) == {"0": 1.0, "1": 1.0})  # the idle one took it
                os.kill(pids[1], signal.SIGKILL)
                killed = time.monotonic()
                failed = await second
                return answers, failed, time.monotonic() - killed, await first

        answers, failed, seconds, survived = asyncio.run(scenario())
        # replica 1's answer (and replica 0's) is the greedy answer Omni gives in process
        ref = omni().generate({k: v for k, v in GREEDY.items() if k != "model"})
        for answer in answers:
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["choices"][0]["message"]["content"] == ref.text and len(ref.token_ids) == 300
            assert body["usage"] == {
                "prompt_tokens": len(ref.prompt_token_ids), "completion_tokens": 300,
                "total_tokens": len(ref.prompt_token_ids) + 300,
            }
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
