"""Async client of the engine process (what the HTTP server uses).

    client = EngineClient(model="CKPT_DIR", device="cuda")   # starts the engine process
    await client.start()                                    # waits until the model is loaded
    async for event in client.generate(request): ...        # {"type": "text"|"audio"|"finished", ...}
    await client.abort(request_id)
    client.close()

A request that the engine rejects raises ``EngineRequestError`` from ``generate`` (with
``bad_request`` set for the client's own mistakes); other requests are unaffected.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import zmq
import zmq.asyncio

from omniwalk.errors import OmniwalkError
from omniwalk.serve.engine_process import serve_engine
from omniwalk.serve.wire import pack, unpack

START_TIMEOUT_S = 600.0


class EngineRequestError(OmniwalkError):
    def __init__(self, message: str, error_type: str, bad_request: bool):
        super().__init__(message)
        self.error_type, self.bad_request = error_type, bad_request


class EngineClient:
    def __init__(self, **options):
        self._dir = tempfile.mkdtemp(prefix="omniwalk-engine-")
        self.inbox_addr = f"ipc://{Path(self._dir) / 'inbox'}"
        self.outbox_addr = f"ipc://{Path(self._dir) / 'outbox'}"
        self.process = multiprocessing.get_context("spawn").Process(
            target=serve_engine, args=(options, self.inbox_addr, self.outbox_addr), daemon=True
        )
        self.process.start()
        self._ctx = zmq.asyncio.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(self.inbox_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.connect(self.outbox_addr)
        self._queues: dict[str, asyncio.Queue] = {}
        self._receiver: asyncio.Task | None = None
        self.info: dict = {}
        self.stats: dict = {}  # the engine's latest occupancy report (engine.stats())

    async def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for the engine to load its model; raises if it fails or dies first."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not await self._pull.poll(200):
            if not self.process.is_alive():
                raise RuntimeError(f"engine process exited with code {self.process.exitcode} while starting")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"engine did not start within {timeout:.0f}s")
        message = unpack(await self._pull.recv())
        if message["type"] != "ready":
            raise RuntimeError(f"engine failed to start: {message.get('error')}")
        self.info = message
        self._receiver = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            message = unpack(await self._pull.recv())
            if message["type"] == "stats":
                self.stats = message["data"]
                continue
            queue = self._queues.get(message.get("id"))
            if queue is not None:
                queue.put_nowait(message)

    async def generate(self, request: dict) -> AsyncIterator[dict]:
        """Submit ``request`` and yield its events until "finished" (inclusive)."""
        request = {**request, "request_id": request.get("request_id") or uuid.uuid4().hex}
        rid = request["request_id"]
        queue = self._queues[rid] = asyncio.Queue()
        done = False
        try:
            await self._push.send(pack({"type": "add", "request": request}))
            while True:
                message = await queue.get()
                if message["type"] == "error":
                    done = True
                    raise EngineRequestError(message["error"], message["error_type"], message["bad_request"])
                yield message
                if message["type"] == "finished":
                    done = True
                    return
        finally:
            self._queues.pop(rid, None)
            if not done:  # the consumer went away (e.g. an HTTP client disconnected): free the work
                self._push.send(pack({"type": "abort", "id": rid}))

    async def abort(self, request_id: str) -> None:
        await self._push.send(pack({"type": "abort", "id": request_id}))

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine process (a "shutdown" message, then a kill after ``timeout``); idempotent."""
        if self._ctx.closed:
            return
        if self._receiver is not None:
            self._receiver.cancel()
        if self.process.is_alive():
            sync = zmq.Context.instance().socket(zmq.PUSH)
            sync.connect(self.inbox_addr)
            sync.send(pack({"type": "shutdown"}))
            sync.close(linger=1000)
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
        self._ctx.destroy(linger=0)
