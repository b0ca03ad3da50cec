"""The engine replica: one omniwalk engine process behind a Ray Serve deployment.

    EngineReplica(options)          starts the engine process (``EngineClient``, listening on this node's
                                    address for remote clients), waits for its model
    generate(request_id) -> stream  [Routed(replica, endpoint)] at once; [Report(...)] when the request,
                                    sent by the ingress straight to the engine, has ended
    info() / adapters() / stats()   the model's ``ModelInfo``; the LoRA adapters it loaded at start; its stats
    check_health()                  raises once the engine process is gone: Ray replaces the replica

Its stats are also Ray metrics, ``ray_omniwalk_engine{replica, stage, quantity}`` beside Ray Serve's own.

The handle call routes and accounts; it does not carry the request's events. Ray Serve's router
chooses the replica, counts the call as one of its ongoing requests (what ``max_ongoing_requests``,
autoscaling and a drain read) until the request ends, and cancels it when its caller does. The
request itself and its events go between the ingress and the engine process over ZMQ (the Routed
item's ``endpoint``); as streamed items they would cost each process on its way about a millisecond of
CPU a token (docs/deploy.md measures both). The engine's own outcomes are items too, never
exceptions across Ray: an engine process that is gone ends the call with a ``Gone`` item naming
this replica (the ingress retries a request that had no output yet elsewhere); a call cancelled
before its request ended aborts it in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from omniwalk.models.family import ModelInfo
from omniwalk.serve.engine_client import EngineClient, EngineUnavailableError

EXPORT_INTERVAL_S = 1.0  # how often the stats are handed to Ray's metrics (which exports them on its own period)


@dataclass
class Gone:
    """The replica's engine process is gone: the request ended here (with or without output)."""

    replica: str
    reason: str


@dataclass
class Routed:
    """The replica that took the call, and where its engine process takes the request."""

    replica: str
    endpoint: str


@dataclass
class Report:
    """A replica's id and its stats (``EngineClient.stats`` plus its own counts), once its request ended."""

    replica: str
    stats: dict


class EngineReplica:
    """The user class of the engine deployment (``app.py`` wraps it with ``serve.deployment``)."""

    async def __init__(self, options: dict):
        import ray
        from ray import serve

        self.replica = serve.get_replica_context().replica_id.unique_id
        self.client = EngineClient(data_host=ray.util.get_node_ip_address(), **options)
        self.num_served = 0
        await self.client.start()
        self.client.watch(lambda reason: None)  # (fails requests in flight at once; check_health reports it)
        self._export = asyncio.create_task(self._export_stats())

    async def _export_stats(self) -> None:
        """This replica's stats as Ray metrics (``ray_omniwalk_engine{replica, stage, quantity}`` where Ray
        exports its own and Serve's: one Prometheus job over Ray's nodes sees the whole application)."""
        from ray.serve.metrics import Gauge

        gauge = Gauge("omniwalk_engine", "Engine state by stage and quantity", tag_keys=("stage", "quantity"))
        while True:
            for stage, values in self.stats().items():
                for quantity, value in values.items():
                    gauge.set(value, tags={"stage": stage, "quantity": quantity})
            await asyncio.sleep(EXPORT_INTERVAL_S)

    def info(self) -> ModelInfo:
        return self.client.info

    def adapters(self) -> list[str]:
        return list(self.client.adapters)

    def stats(self) -> dict:
        own = {"up": float(self.client.unavailable is None), "unfinished": self.client.num_unfinished}
        return {**self.client.stats, "replica": {**own, "served": self.num_served}}

    def check_health(self) -> None:
        if self.client.unavailable or not self.client.is_alive:
            raise RuntimeError(f"engine replica {self.replica}: {self.client.unavailable or 'engine process exited'}")

    async def generate(self, request_id: str, key: str | None = None, avoid: tuple = ()) -> AsyncIterator[list]:
        """Follow request ``request_id`` while the ingress runs it on this replica's engine (``key`` and
        ``avoid`` are for the request router only)."""
        try:
            self.client.open_remote(request_id)
        except EngineUnavailableError as e:
            yield [Gone(self.replica, str(e))]
            return
        self.num_served += 1
        yield [Routed(self.replica, self.client.endpoint)]
        try:
            await self.client.ended(request_id)
        except EngineUnavailableError as e:
            yield [Gone(self.replica, str(e))]
            return
        yield [Report(self.replica, self.stats())]

    def __del__(self):
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
