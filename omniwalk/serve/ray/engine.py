"""The engine replica: one omniwalk engine process behind a Ray Serve deployment.

    EngineReplica(options)          starts the engine process (``EngineClient``), waits for its model
    generate(request) -> stream     each item a list of the request's events that were ready together
    info() / stats()                the model's ``ModelInfo``; this replica's stats
    check_health()                  raises once the engine process is gone: Ray replaces the replica

Its stats are also Ray metrics, ``ray_omniwalk_engine{replica, stage, quantity}`` beside Ray Serve's own.

Events travel as ``wire`` dataclasses. Coalescing: an item carries every event of the request that is
waiting when the previous item was taken: one engine step's deltas, or more when the consumer is
slower. (A request's step often has one delta, its token: then an item is a token; docs/deploy.md
measures what an item costs.) The engine's own outcomes
are items too, never exceptions across Ray: a request the engine refused is a ``Failed`` event; an
engine process that is gone ends the stream with a ``Gone`` event naming this replica (the ingress
retries a request that had no output yet elsewhere). A finished request's last item carries this
replica's ``Report`` (its id and stats) just before the Finished: that is how the ingress sees every
replica's stats without a call of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from omniwalk.models.family import ModelInfo
from omniwalk.serve.engine_client import EngineClient, EngineRequestError, EngineUnavailableError
from omniwalk.serve.wire import Delta, Failed, Finished

EXPORT_INTERVAL_S = 1.0  # how often the stats are handed to Ray's metrics (which exports them on its own period)


@dataclass
class Gone:
    """The replica's engine process is gone: the request ended here (with or without output)."""

    replica: str
    reason: str


@dataclass
class Report:
    """A replica's id and its stats (``EngineClient.stats`` plus its own counts), after a Finished."""

    replica: str
    stats: dict


class EngineReplica:
    """The user class of the engine deployment (``app.py`` wraps it with ``serve.deployment``)."""

    async def __init__(self, options: dict):
        from ray import serve

        self.replica = serve.get_replica_context().replica_id.unique_id
        self.client = EngineClient(**options)
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

    def stats(self) -> dict:
        own = {"up": float(self.client.unavailable is None), "unfinished": self.client.num_unfinished}
        return {**self.client.stats, "replica": {**own, "served": self.num_served}}

    def check_health(self) -> None:
        if self.client.unavailable or not self.client.is_alive:
            raise RuntimeError(f"engine replica {self.replica}: {self.client.unavailable or 'engine process exited'}")

    async def generate(self, request: dict, key: str | None = None, avoid: tuple = ()) -> AsyncIterator[list]:
        """The request's events, coalesced (``key`` and ``avoid`` are for the request router only)."""
        if self.client.unavailable:
            yield [Gone(self.replica, self.client.unavailable)]
            return
        self.num_served += 1
        async for batch in coalesced(self.client.generate(request)):
            last = batch[-1]
            if isinstance(last, EngineRequestError):
                batch[-1] = Failed(request.get("request_id"), str(last), last.error_type, last.bad_request, last.param)
            elif isinstance(last, EngineUnavailableError):
                batch[-1] = Gone(self.replica, str(last))
            elif isinstance(last, Exception):
                raise last
            elif isinstance(last, Finished):  # (before it: a consumer stops reading at the Finished)
                batch.insert(len(batch) - 1, Report(self.replica, self.stats()))
            yield batch

    def __del__(self):
        client = getattr(self, "client", None)
        if client is not None:
            client.close()


async def coalesced(events: AsyncIterator[Delta | Finished]) -> AsyncIterator[list]:
    """``events`` in lists: each one everything that arrived while the previous list was being taken.
    An exception ends the stream as the last element of the last list. Closing this generator closes
    ``events`` (which aborts the request in the engine)."""
    ready: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in events:
                ready.put_nowait(event)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, in order
            ready.put_nowait(e)

    pumping = asyncio.ensure_future(pump())
    try:
        while True:
            batch = [await ready.get()]
            while not ready.empty():
                batch.append(ready.get_nowait())
            yield batch
            if isinstance(batch[-1], (Finished, Exception)):
                return
    finally:
        pumping.cancel()
        await asyncio.gather(pumping, return_exceptions=True)
