"""The routing policy (omniwalk/serve/routing.py): least outstanding, rendezvous affinity and its
stability, saturation fallback, health, and the affinity keys of chat, Responses and realtime requests.

``--data-parallel 2``: two engine processes behind one server, as the official ``openai`` client
sees them. Requests go to the least loaded replica (affinity off here: which replica holds a
conversation's prefix is the routing policy's test, tests/serve/test_routing.py); a replica whose
process is killed fails the requests it held with a 503 (an OpenAI error body, at once), is reported dead in /health and
/metrics, and the other one keeps serving."""

import asyncio
import collections
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

from omniwalk.config import RoutingConfig, ServerConfig
from omniwalk.errors import ConfigError
from omniwalk.serve.engine_client import EngineRequestError
from omniwalk.serve.replicas import Replicas
from omniwalk.serve.routing import NoReplica, ReplicaLoad, Router, affinity_key

KEYS = [f"session:{i}" for i in range(4000)]


def loads(*outstanding: int, prefix: str = "replica-") -> list[ReplicaLoad]:
    return [ReplicaLoad(f"{prefix}{i}", n) for i, n in enumerate(outstanding)]


def homes(names: list[str], keys=KEYS) -> dict[str, str]:
    """Each key's replica among idle replicas of these names (affinity never falls back at 0 load)."""
    router, replicas = Router(RoutingConfig()), [ReplicaLoad(n, 0) for n in names]
    return {k: router.choose(replicas, k) for k in keys}


def test_least_outstanding_without_a_key_or_with_affinity_off():
    router = Router(RoutingConfig())
    assert router.choose(loads(3, 1, 2), None) == "replica-1"
    assert router.choose(loads(2, 0, 0), None) == "replica-1"  # ties: the first in order
    off = Router(RoutingConfig(affinity=False))
    assert {off.choose(loads(5, 4, 0, 4), k) for k in KEYS[:50]} == {"replica-2"}
    assert router.counts == {"affinity": 0, "fallback": 0, "least_loaded": 2}


def test_affinity_is_stable_and_spreads_keys_evenly():
    names = [f"replica-{i}" for i in range(8)]
    first = homes(names)
    assert first == homes(list(reversed(names)))  # the order replicas are listed in does not matter
    counts = collections.Counter(first.values())
    assert set(counts) == set(names)
    assert all(abs(c - len(KEYS) / 8) < 0.2 * len(KEYS) / 8 for c in counts.values()), counts


@pytest.mark.parametrize("n", [4, 16])
def test_adding_or_removing_a_replica_moves_only_its_share_of_keys(n):
    names = [f"replica-{i}" for i in range(n)]
    before = homes(names)
    grown = homes(names + ["replica-new"])
    moved = [k for k in KEYS if grown[k] != before[k]]
    assert all(grown[k] == "replica-new" for k in moved)  # keys only move to the new replica
    assert abs(len(moved) - len(KEYS) / (n + 1)) < 0.25 * len(KEYS) / (n + 1), len(moved)
    shrunk = homes(names[1:])
    moved = [k for k in KEYS if shrunk[k] != before[k]]
    assert all(before[k] == "replica-0" for k in moved)  # only the removed replica's keys move
    assert len(moved) == sum(v == "replica-0" for v in before.values())
    assert abs(len(moved) - len(KEYS) / n) < 0.25 * len(KEYS) / n, len(moved)


def test_a_router_rehashes_a_key_when_its_healthy_replicas_change():
    router, names = Router(RoutingConfig()), [f"replica-{i}" for i in range(8)]
    fresh = homes(names + ["replica-new"], KEYS[:500])
    for key in KEYS[:500]:
        router.choose([ReplicaLoad(n, 0) for n in names], key)  # (remembered for these 8)
        assert router.choose([ReplicaLoad(n, 0) for n in names + ["replica-new"]], key) == fresh[key]


def test_saturated_home_falls_back_to_the_least_loaded():
    router = Router(RoutingConfig(saturation=4, max_excess=2))
    key = next(k for k in KEYS if homes(["replica-0", "replica-1", "replica-2"], [k])[k] == "replica-0")
    assert router.choose(loads(2, 1, 0), key) == "replica-0"  # 2 beyond the least: still home
    assert router.choose(loads(3, 1, 1), key) == "replica-0"
    assert router.choose(loads(3, 1, 0), key) == "replica-2"  # 3 beyond: saturated relative to the least
    assert router.choose(loads(4, 4, 4), key) == "replica-0"  # all saturated: the least loaded (first)
    assert router.choose(loads(4, 3, 3), key) == "replica-1"  # at the absolute bound
    assert router.counts == {"affinity": 2, "fallback": 3, "least_loaded": 0}


def test_unhealthy_replicas_are_skipped_and_none_healthy_is_a_typed_error():
    router = Router(RoutingConfig())
    sick = [ReplicaLoad("replica-0", 0, healthy=False), ReplicaLoad("replica-1", 5), ReplicaLoad("replica-2", 7)]
    assert router.choose(sick, None) == "replica-1"
    names = ["replica-0", "replica-1", "replica-2"]
    for key, home in homes(names, KEYS[:300]).items():
        got = router.choose([ReplicaLoad(n, 0, healthy=n != "replica-0") for n in names], key)
        # the sick replica's keys move; the others' stay
        assert got != "replica-0" and (got == home or home == "replica-0")
    with pytest.raises(NoReplica, match="no healthy replica among 2"):
        router.choose([ReplicaLoad("a", 0, healthy=False), ReplicaLoad("b", 0, healthy=False)], "session:x")
    with pytest.raises(NoReplica):
        router.choose([], None)


SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is a walk?"}


def test_chat_turns_share_a_key_and_other_prefixes_do_not():
    one = affinity_key({"messages": [SYSTEM, FIRST]})
    later = [SYSTEM, FIRST, {"role": "assistant", "content": "A path."}, {"role": "user", "content": "Longer?"}]
    assert one is not None and affinity_key({"messages": later, "model": "m", "stream": True}) == one
    assert affinity_key({"messages": [{"role": "system", "content": "You are verbose."}, FIRST]}) != one
    assert affinity_key({"messages": [SYSTEM, {"role": "user", "content": "Other?"}]}) != one
    assert affinity_key({"messages": [FIRST]}) != one
    parts = {"role": "user", "content": [{"type": "text", "text": "What is a walk?"}]}
    assert affinity_key({"messages": [{"role": "developer", "content": "You are terse."}, parts]}) == one
    dumped = {"role": "user", "content": [{"type": "text", "text": "What is a walk?", "image_url": None}]}
    assert affinity_key({"messages": [SYSTEM, dumped]}) == one  # (a schema's dump may name unset fields)
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    with_audio = affinity_key({"messages": [SYSTEM, {"role": "user", "content": [audio]}]})
    assert with_audio not in (None, one)
    assert affinity_key({"messages": []}) is None and affinity_key({}) is None


def test_responses_input_and_realtime_session_keys():
    chat = affinity_key({"messages": [SYSTEM, FIRST]})
    assert affinity_key({"instructions": "You are terse.", "input": "What is a walk?"}) == chat
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is a walk?"}]}
    assert affinity_key({"instructions": "You are terse.", "input": [message]}) == chat
    assert affinity_key({"input": "What is a walk?"}) == affinity_key({"messages": [FIRST]})
    # a continuation's body alone does not name its root: the caller passes the expanded conversation
    assert affinity_key({"input": "Longer?", "previous_response_id": "resp_1"}) is None
    expanded = [SYSTEM, FIRST, {"role": "assistant", "content": "A path."}, {"role": "user", "content": "Longer?"}]
    assert affinity_key({"messages": expanded, "previous_response_id": "resp_1"}) == chat
    assert affinity_key({}, session="sess_1") == "session:sess_1" != affinity_key({}, session="sess_2")


def test_config_bounds():
    with pytest.raises(ConfigError, match="routing_saturation must be >= 1"):
        ServerConfig(routing_saturation=0)
    with pytest.raises(ConfigError, match="routing_max_excess must be >= 0"):
        RoutingConfig(max_excess=-1)
    assert ServerConfig(routing_affinity=False).routing == RoutingConfig(affinity=False)


def test_data_parallel_replicas_route_through_the_policy():
    from types import SimpleNamespace

    from omniwalk.serve.engine_client import EngineUnavailableError
    from omniwalk.serve.replicas import Replicas

    replicas = Replicas.__new__(Replicas)  # (no engine processes: their load is what routing reads)
    replicas.clients = [SimpleNamespace(num_unfinished=n, unavailable=None) for n in (2, 0, 1)]
    replicas.router, replicas.dead = Router(RoutingConfig(max_excess=1)), {}
    assert replicas.pick() is replicas.clients[1]
    key = next(k for k in KEYS if homes(["replica-0", "replica-1", "replica-2"], [k])[k] == "replica-2")
    assert replicas.pick(key) is replicas.clients[2]  # its home, 1 beyond the least loaded
    replicas.clients[2].num_unfinished = 2
    assert replicas.pick(key) is replicas.clients[1]  # 2 beyond: saturated
    replicas.dead[1] = "the engine process exited with code -9"
    replicas.clients[0].unavailable = "gone"
    assert replicas.pick(key) is replicas.clients[2]
    replicas.dead[2] = "the engine process exited with code -9"
    with pytest.raises(EngineUnavailableError, match="gone"):
        replicas.pick(key)


LONG = {"model": "qwen3-omni", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000, "ignore_eos": True}
HOLD = {**LONG, "max_tokens": 2001}  # fault server: 40 ms a token at least
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
    # the fault server: its requests of 41 and 2001 tokens take at least 20 and 40 ms a token (0.8 s, 80 s), so
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
