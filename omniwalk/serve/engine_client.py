"""Async client of the engine process (what the HTTP server uses).

    client = EngineClient(model="CKPT_DIR", device="cuda")   # starts the engine process
    await client.start()                                    # waits until the model is loaded
    async for event in client.generate(request): ...        # wire.Delta ..., then wire.Finished
    await client.abort(request_id)
    await client.adapter_call("load", name, path)          # LoRA adapters: "load" / "unload"; client.adapters
    client.close()

Given ``data_host``, the engine also listens there for remote clients (``client.endpoint``, see
``wire.py``); ``open_remote(id)`` / ``ended(id)`` follow such a request from here, also one that a remote
client sent (or that ended) before ``open_remote``.

A request that the engine rejects raises ``EngineRequestError`` from ``generate`` (with
``bad_request`` set for the client's own mistakes); other requests are unaffected. When the
engine process dies (``watch`` notices at once through its sentinel), or ``fail_all`` is called
(a shutdown's grace period ran out), every request in flight raises ``EngineUnavailableError``,
and so does every later one.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import zmq
import zmq.asyncio

from omniwalk.errors import OmniwalkError
from omniwalk.models.family import ModelInfo
from omniwalk.serve.engine_process import serve_engine
from omniwalk.serve.wire import (
    Abort,
    AdapterCall,
    AdapterReply,
    Add,
    Delta,
    Ended,
    Failed,
    Fatal,
    Finished,
    Ready,
    Shutdown,
    Stats,
    pack,
    unpack,
)

START_TIMEOUT_S = 600.0
MAX_ENDED_UNOPENED = 4096  # remote requests remembered as ended before anyone followed them here


class EngineRequestError(OmniwalkError):
    def __init__(self, message: str, error_type: str, bad_request: bool, param: str | None = None):
        super().__init__(message)
        self.error_type, self.bad_request, self.param = error_type, bad_request, param


class EngineUnavailableError(OmniwalkError):
    """The engine process is gone (or the server is shutting down): a 503."""


class EngineClient:
    def __init__(self, data_host: str | None = None, **options):
        self._dir = tempfile.mkdtemp(prefix="omniwalk-engine-")
        self.inbox_addr = f"ipc://{Path(self._dir) / 'inbox'}"
        self.outbox_addr = f"ipc://{Path(self._dir) / 'outbox'}"
        self.process = multiprocessing.get_context("spawn").Process(
            target=serve_engine, args=(options, self.inbox_addr, self.outbox_addr, data_host), daemon=True
        )
        self.process.start()
        self._ctx = zmq.asyncio.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(self.inbox_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.connect(self.outbox_addr)
        self._queues: dict[str, asyncio.Queue] = {}
        self._ended_unopened: OrderedDict[str, None] = OrderedDict()  # remote requests ended before open_remote
        self._receiver: asyncio.Task | None = None
        self.info: ModelInfo | None = None  # what the loaded model offers, once the engine is ready
        self.endpoint: str | None = None  # where remote clients reach the engine (given a data_host)
        self.adapters: list[str] = []  # the LoRA adapters it serves (requests name one as their model)
        self._calls: dict[str, asyncio.Future] = {}  # AdapterCall id -> its reply
        self.stats: dict = {}  # the engine's latest occupancy report (engine.stats())
        self.fatal_error: str | None = None  # what the engine process reported before it exited
        self.unavailable: str | None = None  # why requests cannot be served any more
        self._watch_loop: asyncio.AbstractEventLoop | None = None

    async def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for the engine to load its model; raises if it fails or dies first."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not await self._pull.poll(200):
            if not self.process.is_alive():
                raise RuntimeError(f"engine process exited with code {self.process.exitcode} while starting")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"engine did not start within {timeout:.0f}s")
        message = unpack(await self._pull.recv())[0]
        if not isinstance(message, Ready):
            raise RuntimeError(f"engine failed to start: {message.error}")
        self.info = ModelInfo.from_dict(message.info)
        self.adapters, self.endpoint = list(message.adapters), message.endpoint
        self._receiver = asyncio.create_task(self._receive())

    def watch(self, on_exit: Callable[[str], None]) -> None:
        """Call ``on_exit(reason)`` as soon as the engine process exits (after ``fail_all``)."""
        loop = self._watch_loop = asyncio.get_running_loop()

        async def report() -> None:
            await asyncio.sleep(0.2)  # the receiver may still hold the engine's last ("fatal") message
            self.process.join(1.0)
            reason = f"the engine process exited with code {self.process.exitcode}"
            reason += f": {self.fatal_error}" if self.fatal_error else ""
            self.fail_all(reason)
            on_exit(reason)

        def exited() -> None:
            loop.remove_reader(self.process.sentinel)
            self._report = loop.create_task(report())

        loop.add_reader(self.process.sentinel, exited)

    def fail_all(self, reason: str) -> None:
        """Fail every request in flight, and every later one, with ``EngineUnavailableError(reason)``."""
        self.unavailable = self.unavailable or reason
        for queue in self._queues.values():
            queue.put_nowait(None)  # (None: the engine is unavailable)

    async def _receive(self) -> None:
        while True:
            for message in unpack(await self._pull.recv()):
                if isinstance(message, Stats):
                    self.stats = message.data
                elif isinstance(message, Fatal):
                    self.fatal_error = message.error
                elif isinstance(message, AdapterReply):
                    self.adapters = list(message.adapters)
                    if (call := self._calls.pop(message.id, None)) is not None and not call.done():
                        call.set_result(message)
                elif (queue := self._queues.get(message.id)) is not None:
                    queue.put_nowait(message)
                elif isinstance(message, Ended):
                    self._ended_unopened[message.id] = None
                    while len(self._ended_unopened) > MAX_ENDED_UNOPENED:
                        self._ended_unopened.popitem(last=False)  # (the oldest: requests never followed here)

    async def generate(self, request: dict) -> AsyncIterator[Delta | Finished]:
        """Submit ``request`` and yield its Deltas, then its Finished."""
        if self.unavailable:
            raise EngineUnavailableError(self.unavailable)
        request = {**request, "request_id": request.get("request_id") or uuid.uuid4().hex}
        rid = request["request_id"]
        queue = self._queues[rid] = asyncio.Queue()
        done = False
        try:
            await self._push.send(pack(Add(request, time.monotonic())))
            while True:
                message = await queue.get()
                if message is None:
                    raise EngineUnavailableError(self.unavailable)
                if isinstance(message, Failed):
                    done = True
                    raise EngineRequestError(message.error, message.error_type, message.bad_request, message.param)
                done = isinstance(message, Finished)  # (before the yield: a consumer may close it at its Finished)
                yield message
                if done:
                    return
        finally:
            self._queues.pop(rid, None)
            if not done and not self._ctx.closed:  # the consumer went away (e.g. a client hung up): free the work
                self._push.send(pack(Abort(rid)))

    def open_remote(self, rid: str) -> None:
        """Follow a remote client's request ``rid`` (it counts as unfinished here until ``ended``)."""
        if self.unavailable:
            raise EngineUnavailableError(self.unavailable)
        queue = self._queues[rid] = asyncio.Queue()
        if rid in self._ended_unopened:  # (its client sent it before this replica's call came)
            del self._ended_unopened[rid]
            queue.put_nowait(Ended(rid))

    async def ended(self, rid: str) -> None:
        """Wait for the end of the remote request ``rid`` (opened with ``open_remote``); raises
        ``EngineUnavailableError`` if the engine goes first. A wait that does not end (it was
        cancelled: the remote client left) aborts the request."""
        done = False
        try:
            message = await self._queues[rid].get()
            if message is None:
                raise EngineUnavailableError(self.unavailable)
            done = isinstance(message, Ended)
        finally:
            self._queues.pop(rid, None)
            if not done and not self._ctx.closed:
                self._push.send(pack(Abort(rid)))

    async def adapter_call(self, action: str, name: str, path: str | None = None) -> None:
        """Load (from ``path``) or unload the LoRA adapter ``name`` in the engine; ``EngineRequestError`` if
        it refuses (``bad_request``: a bad adapter or an unknown name)."""
        if self.unavailable:
            raise EngineUnavailableError(self.unavailable)
        call_id = uuid.uuid4().hex
        reply = self._calls[call_id] = asyncio.get_running_loop().create_future()
        await self._push.send(pack(AdapterCall(call_id, action, name, path)))
        message = await reply
        if message.error is not None:
            raise EngineRequestError(message.error, message.error_type, message.bad_request, message.param)

    async def abort(self, request_id: str) -> None:
        await self._push.send(pack(Abort(request_id)))

    @property
    def num_unfinished(self) -> int:
        """Requests submitted and not finished (what routing among replicas balances)."""
        return len(self._queues)

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine process (a "shutdown" message, then a kill after ``timeout``); idempotent."""
        if self._ctx.closed:
            return
        if self._watch_loop is not None and not self._watch_loop.is_closed():
            self._watch_loop.remove_reader(self.process.sentinel)  # an exit asked for is no failure
        if self._receiver is not None:
            self._receiver.cancel()
        if self.process.is_alive():
            sync = zmq.Context.instance().socket(zmq.PUSH)
            sync.connect(self.inbox_addr)
            sync.send(pack(Shutdown()))
            sync.close(linger=1000)
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
        self._ctx.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)  # the sockets' folder
