"""The engine processes behind one HTTP server: ``--data-parallel N`` replicas of the whole model.

    replicas = Replicas(options, n)     # starts n engine processes (replica r on its own devices)
    await replicas.start()              # all loaded (one failing to start fails the server's start)
    async for event in replicas.generate(request): ...   # on the least loaded live replica
    await replicas.adapter_call("load", name, path)      # every replica, rolled back on all if one refuses

Routing (``routing.Router``, the one policy): a request goes to the live replica with the fewest
unfinished requests (those this server sent it that have not finished; ties to the lowest index),
or, given an affinity key (``routing.affinity_key``: a chat's prefix, a realtime session), to the
replica holding that key's prefix pages unless it is saturated; it stays there. Health: a
replica whose process exits fails the requests it held at once (503, ``EngineUnavailableError``),
leaves the routing and is reported dead in ``/health`` (the server is then "degraded") and in
``/metrics`` (``quantity="up"``); the others keep serving. It is not restarted: when the last one
dies the supervisor's ``on_exit`` runs (the server exits 1, a process supervisor restarts it).
Replica r runs on the devices of ``parallel.placement.replica_options`` (CUDA indices past the
replicas before it), so N replicas of a one-GPU model use GPUs 0..N-1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable

from omniwalk.config import RoutingConfig
from omniwalk.models.family import ModelInfo
from omniwalk.parallel.placement import replica_options
from omniwalk.serve.engine_client import EngineClient, EngineRequestError, EngineUnavailableError
from omniwalk.serve.routing import NoReplica, ReplicaLoad, Router
from omniwalk.serve.wire import Delta, Finished


class Replicas:
    def __init__(self, options: dict, n: int = 1, routing: RoutingConfig | None = None):
        self.clients = [EngineClient(**replica_options(options, r)) for r in range(n)]
        self.router = Router(routing or RoutingConfig())
        self.dead: dict[int, str] = {}  # replica -> why its process exited
        self._on_all_dead: Callable[[str], None] | None = None

    @property
    def info(self) -> ModelInfo | None:
        return self.clients[0].info

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self.clients]

    async def start(self) -> None:
        await asyncio.gather(*(c.start() for c in self.clients))

    def watch(self, on_all_dead: Callable[[str], None]) -> None:
        """Take a replica out when its process exits; call ``on_all_dead(reason)`` when none is left."""
        self._on_all_dead = on_all_dead
        for r, client in enumerate(self.clients):
            client.watch(lambda reason, r=r: self._exited(r, reason))

    def _exited(self, replica: int, reason: str) -> None:
        self.dead[replica] = reason
        if len(self.dead) == len(self.clients):
            self._on_all_dead(
                reason if len(self.clients) == 1 else f"every replica is gone; replica {replica}: {reason}"
            )
        else:
            live = len(self.clients) - len(self.dead)
            print(f"omniwalk: error: replica {replica}: {reason}; {live} replica(s) serve", file=sys.stderr, flush=True)

    def fail_all(self, reason: str) -> None:
        for client in self.clients:
            client.fail_all(reason)

    def pick(self, key: str | None = None) -> EngineClient:
        """The replica the routing policy chooses among the live ones (``key``: the request's affinity key)."""
        loads = [
            ReplicaLoad(f"replica-{r}", c.num_unfinished, healthy=r not in self.dead and not c.unavailable)
            for r, c in enumerate(self.clients)
        ]
        try:
            name = self.router.choose(loads, key)
        except NoReplica:
            raise EngineUnavailableError(self.clients[0].unavailable or "no engine replica is serving") from None
        return self.clients[int(name.removeprefix("replica-"))]

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters served (every replica loads the same; a dead one's list is as it was)."""
        return tuple(self.clients[0].adapters)

    async def adapter_call(self, action: str, name: str, path: str | None = None) -> None:
        """Load (from ``path``) or unload adapter ``name`` on every replica, one after another; a load one
        refuses (``EngineRequestError``) is undone on those that took it, so all serve the same adapters."""
        done = []
        try:
            for client in self.clients:
                await client.adapter_call(action, name, path)
                done.append(client)
        except EngineRequestError:
            if action == "load":
                for client in done:
                    await client.adapter_call("unload", name)
            raise

    def generate(self, request: dict, key: str | None = None) -> AsyncIterator[Delta | Finished]:
        """The chosen replica's own event stream (so closing it aborts there). The request counts
        against that replica from the stream's first step, which its consumer takes before
        yielding to the event loop (``run.EngineRun``), so concurrent arrivals spread out."""
        return self.pick(key).generate(request)

    @property
    def stats(self) -> dict[str, dict]:
        """Per replica: its engine's latest stats, and its own level (up, unfinished requests)."""
        return {
            str(r): {**c.stats, "replica": {"up": float(r not in self.dead), "unfinished": c.num_unfinished}}
            for r, c in enumerate(self.clients)
        }

    def health(self) -> list[dict]:
        out = []
        for r, client in enumerate(self.clients):
            status = "engine_dead" if r in self.dead else "ready" if client.info is not None else "starting"
            entry = {"replica": r, "status": status, "pid": client.process.pid}
            out.append(entry | ({"reason": self.dead[r]} if r in self.dead else {}))
        return out

    def close(self) -> None:
        for client in self.clients:
            client.close()
