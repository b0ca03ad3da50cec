"""The one routing policy: which engine replica takes a request.

    router = Router(RoutingConfig())
    name = router.choose([ReplicaLoad("replica-0", 3), ReplicaLoad("replica-1", 1)], affinity_key(body))

Least outstanding work by default: the healthy replica with the fewest unfinished requests (ties: the
first in the order given). With ``affinity`` on, a request that has a key (a realtime session; a chat's
conversation prefix) goes to the replica its key hashes to, so a conversation's later turns find their
prefix pages in that replica's prefix cache. The hash is rendezvous (highest random weight) over the
healthy replicas' names: adding or removing one of n replicas moves only the keys it wins or held
(~1/n of them). The key's replica is skipped for the least loaded one when it is saturated: at
``saturation`` unfinished requests or more, or more than ``max_excess`` beyond the least loaded one's
(a hot key must not queue its turns behind a busy replica while others idle). Both the data-parallel
router (``replicas.py``) and the Ray Serve router use this module; the fleet simulator
(``benchmarks/fleet/``) runs it against modelled replicas.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from omniwalk.config import RoutingConfig
from omniwalk.errors import OmniwalkError

__all__ = ["NoReplica", "ReplicaLoad", "Router", "RoutingConfig", "affinity_key"]

NAME, OUTSTANDING, HEALTHY = attrgetter("name"), attrgetter("outstanding"), attrgetter("healthy")
TEXT_PARTS = ("text", "input_text", "output_text")  # content part types whose "text" is all they say


class NoReplica(OmniwalkError):
    """No healthy replica is left to route to."""


@dataclass(frozen=True)
class ReplicaLoad:
    """What the policy sees of one replica."""

    name: str  # stable id (the Ray replica id, or "replica-0", ...): the rendezvous hash is over names
    outstanding: int  # unfinished requests routed to it (or reported by it)
    healthy: bool = True


def affinity_key(body: dict, session: str | None = None) -> str | None:
    """The key a conversation's turns share, or None when the request has no reusable prefix.

    A realtime session: its id (``session``, passed by the caller). A chat completion: a digest of its
    ``messages`` up to and including the first user message (the system / developer prompt and the
    first question, which every later turn repeats). A Responses API request: the same digest of
    ``instructions`` + its first ``input`` item, so a chain's first turn and a chat of the same
    conversation agree; for a request that continues one (``previous_response_id``) the caller passes
    the expanded conversation as ``messages`` (the chain root's prefix leads it).
    """
    if session is not None:
        return f"session:{session}"
    if body.get("messages"):
        return _digest(body["messages"])
    if body.get("input") and not body.get("previous_response_id"):
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        system = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
        return _digest(system + items)
    return None


def _digest(messages: list) -> str | None:
    """Digest of the messages up to the first user one, as (role, content) with developer = system and
    text-only content parts joined (so "hi" and [{"type": "text", "text": "hi"}] agree)."""
    prefix = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        role = "system" if message.get("role") == "developer" else message.get("role")
        prefix.append([role, _content(message.get("content"))])
        if role == "user":
            break
    text = json.dumps(prefix, sort_keys=True, separators=(",", ":"), default=str)
    return "prefix:" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _content(content):
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in content):
        return "".join(str(p.get("text")) for p in content)
    return content


@functools.lru_cache(maxsize=65536)
def _hash64(text: str) -> int:
    """A 64-bit digest that is the same in every process (``hash()`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _weights(key_hash: int, name_hashes: np.ndarray) -> np.ndarray:
    """The rendezvous weights of replicas (their names' digests, uint64) for a key: MurmurHash3's 64-bit
    finaliser of the xor of the digests, so that each replica's weights for different keys are independent."""
    x = name_hashes ^ np.uint64(key_hash)
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        x = (x ^ (x >> np.uint64(33))) * np.uint64(multiplier)  # (uint64 products wrap: mod 2**64)
    return x ^ (x >> np.uint64(33))


class Router:
    """Chooses a replica per request (see the module head). Keeps counters for metrics: ``affinity``
    (routed to the key's replica), ``fallback`` (its replica was saturated: least loaded instead) and
    ``least_loaded`` (no key, or affinity off)."""

    MAX_HOMES = 65536  # keys whose replica is remembered (for the healthy set it was hashed over)

    def __init__(self, cfg: RoutingConfig):
        self.cfg = cfg
        self.counts = {"affinity": 0, "fallback": 0, "least_loaded": 0}
        self._homes: dict[str, tuple[tuple[str, ...], int]] = {}  # key -> (healthy names, index of its replica)
        self._names: tuple[str, ...] = ()  # the healthy names last hashed, and their digests
        self._name_hashes = np.zeros(0, dtype=np.uint64)

    def choose(self, replicas: Sequence[ReplicaLoad], key: str | None) -> str:
        """Name of the replica to use. Raises NoReplica when none is healthy."""
        healthy = replicas if all(map(HEALTHY, replicas)) else [r for r in replicas if r.healthy]
        if not healthy:
            raise NoReplica(f"no healthy replica among {len(replicas)}")
        least = min(healthy, key=OUTSTANDING)  # (min keeps the first of equals)
        if not self.cfg.affinity or key is None:
            self.counts["least_loaded"] += 1
            return least.name
        home = healthy[self._home(key, tuple(map(NAME, healthy)))]
        if self.is_saturated(home, least):
            self.counts["fallback"] += 1
            return least.name
        self.counts["affinity"] += 1
        return home.name

    def _home(self, key: str, names: tuple[str, ...]) -> int:
        """Index of the key's replica among ``names``: the highest weight, remembered while the names stay
        (the weights are computed once per key and healthy set, not per request)."""
        known = self._homes.get(key)
        if known is not None and known[0] == names:
            return known[1]
        if self._names != names:
            self._names, self._name_hashes = names, np.array([_hash64(n) for n in names], dtype=np.uint64)
        index = int(np.argmax(_weights(_hash64(key), self._name_hashes)))
        if len(self._homes) >= self.MAX_HOMES:
            del self._homes[next(iter(self._homes))]  # (the oldest remembered)
        self._homes[key] = (names, index)
        return index

    def is_saturated(self, replica: ReplicaLoad, least: ReplicaLoad) -> bool:
        return (
            replica.outstanding >= self.cfg.saturation or replica.outstanding > least.outstanding + self.cfg.max_excess
        )
