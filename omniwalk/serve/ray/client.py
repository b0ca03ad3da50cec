"""The ingress side of the engine deployment: ``Replicas``' interface over a ``DeploymentHandle``, so the
HTTP app (``create_app``) runs unchanged in a Ray Serve ingress replica.

    engines = RayEngines(handle, ray_cfg)
    await engines.start()                          # the model's ModelInfo and adapters, from an engine replica
    async for event in engines.generate(request):  # wire.Delta ..., then wire.Finished

A request is one streaming call of ``EngineReplica.generate``, routed by ``router.AffinityRouter``
with the request's affinity key (the caller's: a realtime session's id, a chat's prefix digest; else
the digest of the engine request's own messages). The call's first item names the replica's engine
process (``Routed``); the request goes there over ZMQ (one DEALER per engine process, shared by this
ingress's requests) and its events come back on it. It goes there sooner where it can: the router, in
this process, tells the replica it chose (``CHOICES``), and when that replica's engine is known
here (from an earlier Routed) the request is sent at once, its events held until the call's Routed
confirms the replica (a replica at its limit passes the call on: the request is then aborted there and
sent to the one that took it); so the Ray call's round trip overlaps the engine's work instead of coming
before it. The call's last item is the replica's
``Report`` (its stats), kept when it comes, after the request's Finished has been handed on. Faults:
a replica whose engine process is gone (a ``Gone`` item) or whose actor died is avoided from then on;
the request is sent again to another replica, for up to ``ray_retry_timeout_s``, while its client has
seen none of its output: a stream (``stream`` set: streamed chats, realtime responses) before its
first delta, a collected request (a non-streamed chat, speech) until its Finished, whose output is
all its consumer reads. A stream that had output ends with ``EngineUnavailableError`` (the SSE error
event, or the realtime error event). Ray replaces the failed replica (its health check fails); the
endpoint stays up, so ``watch`` has nothing to do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from omniwalk.config import RayConfig
from omniwalk.models.family import ModelInfo
from omniwalk.serve.engine_client import EngineRequestError, EngineUnavailableError
from omniwalk.serve.ray.engine import Gone, Report, Routed
from omniwalk.serve.routing import affinity_key
from omniwalk.serve.wire import Abort, Add, Delta, Failed, Finished, pack, unpack

_REPLICA_LOST = (RayActorError, ActorUnavailableError)
MAX_RETRY_DELAY_S = 1.0
CHOICES: dict[str, Callable[[str], None]] = {}  # request id -> told the replica the router chose first for it
IDLE_CONNECTION_S = 60.0  # a connection with no request for this long is closed (a replica scaled down or replaced
# leaves its endpoint behind; a live one's is opened again by its next request)


class _ReplicaGone(Exception):
    def __init__(self, replica: str | None, reason: str):
        super().__init__(reason)
        self.replica = replica


class _Connection:
    """This ingress's DEALER to one engine process: Add and Abort out, each request's events to its queue."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.socket.connect(endpoint)
        self.queues: dict[str, asyncio.Queue] = {}
        self.receiver = asyncio.ensure_future(self._receive())
        self.last_used = time.monotonic()

    async def _receive(self) -> None:
        while True:
            for message in unpack(await self.socket.recv()):
                if (queue := self.queues.get(message.id)) is not None:
                    queue.put_nowait(message)

    def send(self, message) -> None:
        if not self.socket.closed:  # (closed: its engine is gone, and so is what it ran)
            self.socket.send(pack(message))  # (queued on the connection: never waits)

    def close(self) -> None:
        self.receiver.cancel()
        self.socket.close(linger=0)


class _Attempt:
    """One call of the engine deployment for a request: the router's first choice, the call's stream, where
    the request went (``connection``, ``routed``) and what came back."""

    def __init__(self, rid: str, chosen: asyncio.Future, stream):
        self.rid, self.chosen, self.stream = rid, chosen, stream
        self.events: asyncio.Queue = asyncio.Queue()
        self.connection: _Connection | None = None
        self.routed: Routed | None = None
        self.following: asyncio.Future | None = None  # (``_follow``: the call's Report or failure)
        self.produced = self.ended = False


class RayEngines:
    def __init__(self, handle, cfg: RayConfig):
        self.handle, self.cfg = handle, cfg
        self.calls = handle.options(stream=True).generate
        self.info: ModelInfo | None = None
        self._adapters: tuple[str, ...] = ()
        self.reports: dict[str, dict] = {}  # replica id -> its latest stats (``Report``)
        self.gone: dict[str, str] = {}  # replica id -> why (ids are not reused: Ray's replacement has a new one)
        self.unavailable: str | None = None  # set by ``fail_all``: every later request fails
        self.num_retries = 0
        # replica id -> requests this ingress sent ahead to its engine that it took / that it turned away
        self.ahead: dict[str, dict[str, int]] = {}
        self.connections: dict[str, _Connection] = {}  # engine endpoint -> this ingress's connection
        self.endpoints: dict[str, str] = {}  # replica id -> its engine's endpoint (from its Routed items)
        self._reporting: set[asyncio.Future] = set()  # the calls of ended requests, until their replica's Report

    async def start(self) -> None:
        """The model's description and its LoRA adapters, from the first engine replica that is up (every
        replica loads the same: the application's ``loras``)."""
        self.info = await self.handle.info.remote()
        self._adapters = tuple(await self.handle.adapters.remote())

    def watch(self, on_all_dead: Callable[[str], None]) -> None:
        """(Ray replaces a failed engine replica: the ingress never exits for one.)"""

    def fail_all(self, reason: str) -> None:
        self.unavailable = self.unavailable or reason

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters the engine replicas loaded at start (``--lora``)."""
        return self._adapters

    async def adapter_call(self, action: str, name: str, path: str | None = None) -> None:
        """Run-time adapter loading is refused through Ray (a 400 naming ``lora_name``): a replica that
        Ray starts later loads the application's ``--lora`` adapters only."""
        message = "adapters are not loaded at run time through Ray: give them at start with --lora NAME=PATH"
        raise EngineRequestError(message, "InvalidRequestError", bad_request=True, param="lora_name")

    async def generate(self, request: dict, key: str | None = None) -> AsyncIterator[Delta | Finished]:
        """The request's events from one engine replica; sent again elsewhere while its client saw none.
        ``key``: its affinity key (``routing.affinity_key``); None: the digest of its own messages."""
        key = key if key is not None else affinity_key(request)
        request = {**request, "request_id": request.get("request_id") or uuid.uuid4().hex}
        rid = request["request_id"]
        deadline, delay = time.monotonic() + self.cfg.ray_retry_timeout_s, 0.05
        while True:
            if self.unavailable:
                raise EngineUnavailableError(self.unavailable)
            attempt = _Attempt(rid, self._chosen(rid), self.calls.remote(rid, key=key, avoid=tuple(self.gone)))
            try:
                await self._place(attempt, request)
                while not attempt.ended:
                    event = await self._next(attempt)
                    attempt.produced = True
                    yield event
                return
            except (_ReplicaGone, *_REPLICA_LOST) as e:
                reason = self._lost(attempt, e)
                if (attempt.produced and request.get("stream")) or time.monotonic() > deadline:
                    raise EngineUnavailableError(f"the engine replica failed: {reason}") from None
            except RayTaskError as e:
                raise EngineRequestError(str(e.cause), type(e.cause).__name__, bad_request=False) from None
            finally:
                self._leave(attempt)
            self.num_retries += 1
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_DELAY_S)

    async def _place(self, attempt: _Attempt, request: dict) -> None:
        """Send the request to the engine of the replica that takes the call: at once where the router's
        first choice's engine is known here (withdrawn if the call's Routed names another), else on Routed."""
        routing = asyncio.ensure_future(self._routed(attempt.stream))
        try:
            await asyncio.wait((attempt.chosen, routing), return_when=asyncio.FIRST_COMPLETED)
            if not routing.done() and (endpoint := self.endpoints.get(attempt.chosen.result())) is not None:
                attempt.connection = self._send(endpoint, request, attempt.events)
            attempt.routed = routed = await routing
        finally:
            routing.cancel()
        self.endpoints[routed.replica] = routed.endpoint
        if attempt.connection is not None:
            taken = attempt.connection.endpoint == routed.endpoint
            counts = self.ahead.setdefault(attempt.chosen.result(), {"sent_ahead": 0, "withdrawn": 0})
            counts["sent_ahead" if taken else "withdrawn"] += 1
            if not taken:  # (the router's first choice passed the call on)
                self._withdraw(attempt.connection, attempt.rid)
                attempt.connection, attempt.events = None, asyncio.Queue()
        if attempt.connection is None:
            attempt.connection = self._send(routed.endpoint, request, attempt.events)
        attempt.following = asyncio.ensure_future(self._follow(attempt.stream, attempt.events))

    async def _next(self, attempt: _Attempt) -> Delta | Finished:
        """The request's next event (``attempt.ended`` set by its last); a failure raised."""
        event = await attempt.events.get()
        if isinstance(event, BaseException):
            raise event
        if isinstance(event, (Failed, Finished)):
            attempt.ended = True
            self._reporting.add(attempt.following)  # (its Report comes after: kept, not waited for)
            attempt.following.add_done_callback(self._reporting.discard)
        if isinstance(event, Failed):
            raise EngineRequestError(event.error, event.error_type, event.bad_request, event.param)
        return event

    def _lost(self, attempt: _Attempt, error: Exception) -> str:
        """The attempt's replica failed (``error``): avoided from now on; why, in a line."""
        attempt.ended = True
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if isinstance(error, _ReplicaGone) and error.replica is not None:
            self.gone[error.replica] = reason
            self.reports.pop(error.replica, None)
            self.endpoints.pop(error.replica, None)
            self.ahead.pop(error.replica, None)
        if attempt.routed is not None and (lost := self.connections.pop(attempt.routed.endpoint, None)) is not None:
            lost.close()  # (its other requests hear of it from their own calls)
            attempt.connection = None
        elif attempt.routed is None and attempt.connection is not None:  # (sent ahead; no replica took the call)
            self._withdraw(attempt.connection, attempt.rid)
            attempt.connection = None
        return reason

    def _leave(self, attempt: _Attempt) -> None:
        """The attempt is over: one its consumer left early (a client hung up) is aborted in the engine."""
        CHOICES.pop(attempt.rid, None)
        if attempt.connection is not None:
            attempt.connection.queues.pop(attempt.rid, None)
        if not attempt.ended:
            if attempt.connection is not None:
                attempt.connection.send(Abort(attempt.rid))
            attempt.stream.cancel()
        if attempt.following is not None and attempt.following not in self._reporting:
            attempt.following.cancel()

    def _chosen(self, rid: str) -> asyncio.Future:
        """The replica id that the request router chooses first for ``rid`` (told from its own thread)."""
        loop = asyncio.get_running_loop()
        chosen = loop.create_future()

        def settle(replica: str) -> None:
            if not chosen.done():
                chosen.set_result(replica)

        CHOICES[rid] = lambda replica: loop.call_soon_threadsafe(settle, replica)
        return chosen

    def _send(self, endpoint: str, request: dict, events: asyncio.Queue) -> _Connection:
        """Send ``request`` to the engine at ``endpoint``; its events go to ``events``."""
        connection = self._connection(endpoint)
        connection.queues[request["request_id"]] = events
        connection.send(Add(request))
        return connection

    @staticmethod
    def _withdraw(connection: _Connection, rid: str) -> None:
        """Abort ``rid`` where it was sent ahead; what it produced there is dropped."""
        connection.queues.pop(rid, None)
        connection.send(Abort(rid))

    async def _routed(self, stream) -> Routed:
        """The call's first item: the replica's engine, or its failure raised."""
        async for batch in stream:
            for item in batch:
                if isinstance(item, Gone):
                    raise _ReplicaGone(item.replica, item.reason)
                if isinstance(item, Routed):
                    return item
        raise _ReplicaGone(None, "the engine replica ended the call")

    async def _follow(self, stream, events: asyncio.Queue) -> None:
        """The rest of the call: a Report is kept; a replica's failure reaches the request's events."""
        try:
            async for batch in stream:
                for item in batch:
                    if isinstance(item, Report):
                        self.reports[item.replica] = item.stats
                    elif isinstance(item, Gone):
                        events.put_nowait(_ReplicaGone(item.replica, item.reason))
        except Exception as e:  # noqa: BLE001 - the replica's actor died (or the call failed): it ends the request
            events.put_nowait(e)

    def _connection(self, endpoint: str) -> _Connection:
        """This ingress's connection to ``endpoint`` (closing those idle for ``IDLE_CONNECTION_S``)."""
        now = time.monotonic()
        for name, idle in list(self.connections.items()):
            if name != endpoint and not idle.queues and now - idle.last_used > IDLE_CONNECTION_S:
                del self.connections[name]
                idle.close()
        if (connection := self.connections.get(endpoint)) is None:
            connection = self.connections[endpoint] = _Connection(endpoint)
        connection.last_used = now
        return connection

    @property
    def stats(self) -> dict[str, dict]:
        """Per engine replica (by Ray replica id): its latest stats, as of its last finished request here,
        and this ingress's requests sent ahead to it (``ingress``: taken; withdrawn, the call passed on)."""
        return {name: {**stats, "ingress": self.ahead.get(name, {})} for name, stats in self.reports.items()}

    def health(self) -> list[dict]:
        return [{"replica": name, "status": "ready"} for name in self.reports]

    def close(self) -> None:
        """This ingress's connections (the engine replicas are Ray's: they outlive an ingress replica)."""
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()
