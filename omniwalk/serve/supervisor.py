"""The server's life: start-up, engine failure, and shutdown with a grace period.

    starting --engine ready--> ready --SIGTERM/Ctrl-C--> draining --(in flight done | grace over)--> exit 0
        |                        |
        +--engine failed---------+--engine process exited--> exit 1 (the error printed)

- An engine that fails to start: its error is printed and the server exits with status 1.
- An engine process that exits later: requests in flight fail at once with 503, ``/health``
  answers 503 with the reason, and the server exits with status 1 so that a supervisor
  (systemd ``Restart=on-failure``, Kubernetes, ...) starts a fresh one. With data-parallel
  replicas (``replicas.py``) that is when the last one exits; before, a dead replica's requests
  fail with 503 and ``/health`` says "degraded" (200) while the others serve.
- SIGTERM or Ctrl-C: the listening socket closes, requests in flight may finish for
  ``shutdown_grace_s``; the ones still running then are failed (503 / an SSE error event) and
  aborted in the engine, and the server exits with status 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

import uvicorn

from omniwalk.serve.replicas import Replicas


class Supervisor:
    def __init__(self, client: Replicas, grace_s: float, url: str = "", model: str | None = None):
        self.client, self.grace_s, self.url, self.model = client, grace_s, url, model
        self.state, self.reason, self.exit_code = "starting", None, 0
        self.started = time.monotonic()  # (the engine processes were started just before)
        self.server: uvicorn.Server | None = None
        self._drain: asyncio.TimerHandle | None = None

    def ready(self) -> None:
        self.state = "ready"
        self.client.watch(self.engine_exited)
        model = self.model or self.client.info.name
        print(f"ready: {self.url} (model {model!r}) after {time.monotonic() - self.started:.1f}s", flush=True)

    def failed_to_start(self, error: BaseException) -> None:
        self._fail("failed", f"the engine failed to start: {error}")

    def engine_exited(self, reason: str) -> None:
        self._fail("engine_dead", reason)

    def _fail(self, state: str, reason: str) -> None:
        self.state, self.reason, self.exit_code = state, reason, 1
        print(f"omniwalk: error: {reason}", file=sys.stderr, flush=True)
        if self.server is not None:
            self.server.should_exit = True

    def drain(self) -> None:
        """A stop signal: let requests in flight finish for the grace period, then fail them."""
        if self.state == "ready":
            self.state = "draining"
        if self._drain is None:
            loop = asyncio.get_running_loop()
            self._drain = loop.call_later(self.grace_s, self.client.fail_all, "the server is shutting down")

    def health(self) -> tuple[int, dict]:
        """200 while serving ("degraded": a data-parallel replica is dead, the others serve), else 503;
        with each replica's own status."""
        replicas = self.client.health()
        degraded = self.state == "ready" and any(r["status"] != "ready" for r in replicas)
        body = {"status": "degraded" if degraded else self.state}
        if self.reason:
            body["reason"] = self.reason
        body["replicas"] = [{k: v for k, v in r.items() if k != "pid"} for r in replicas]  # (no pids for anyone)
        return (200 if self.state == "ready" else 503), body


class Server(uvicorn.Server):
    """uvicorn's server with the supervisor's signal handling: the first SIGINT / SIGTERM starts
    the drain (uvicorn's graceful shutdown, bounded by the grace period), a second one forces the
    exit; no re-raised signal (uvicorn's default), so the exit status is the supervisor's."""

    def __init__(self, config: uvicorn.Config, supervisor: Supervisor):
        super().__init__(config)
        self.supervisor = supervisor
        supervisor.server = self

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        with contextlib.suppress(RuntimeError):  # (no running loop: nothing in flight to drain)
            self.supervisor.drain()

    @contextlib.contextmanager
    def capture_signals(self):
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)
