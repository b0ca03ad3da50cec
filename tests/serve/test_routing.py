"""The routing policy (omniwalk/serve/routing.py): least outstanding, rendezvous affinity and its
stability, saturation fallback, health, and the affinity keys of chat, Responses and realtime requests."""

import collections

import pytest

from omniwalk.config import RoutingConfig, ServerConfig
from omniwalk.errors import ConfigError
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
