"""The engine process: it owns the model and the step loop, so HTTP work never takes its GIL.

Two ZMQ sockets carry ``wire.py``'s messages: the client pushes Add / Abort / Shutdown (and
AdapterCall: load or unload a LoRA adapter) into the inbox; the outbox sends Ready (or Fatal) first,
then each request's Deltas and its Finished or Failed, Stats, and an AdapterReply per AdapterCall.
Given a ``data_host``, a third (a ROUTER on a TCP port of that address, the Ready's ``endpoint``)
serves remote clients (Ray ingresses): each sends Add and Abort there and gets its own requests'
Deltas and Finished or Failed back on its connection; the engine's own client gets an Ended per such
request. Messages are drained between steps; when no request is running the loop blocks on its
sockets instead of spinning.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
import traceback

import zmq

from omniwalk.engine.request import EngineRequest
from omniwalk.errors import InvalidRequestError
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

IDLE_POLL_MS = 100
STATS_INTERVAL_S = 0.05


def serve_engine(options: dict, inbox_addr: str, outbox_addr: str, data_host: str | None = None) -> None:
    """Process entry point: build ``Omni(**options)`` and serve requests until told to stop."""
    # A terminal's Ctrl-C reaches the whole process group; the server process stops this one
    # (a "shutdown" message), so the engine ignores the signal instead of dying mid-step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.bind(inbox_addr)
    outbox.bind(outbox_addr)
    remote = None
    if data_host is not None:
        remote = ctx.socket(zmq.ROUTER)
        remote.bind(f"tcp://{data_host}:*")
    try:
        from omniwalk.omni import Omni

        start = time.monotonic()
        omni = Omni(**options)
        phases = ", ".join(f"{name} {s:.1f}s" for name, s in omni.startup.items())
        print(f"engine: started in {time.monotonic() - start:.1f}s ({phases})", flush=True)
        if omni.family.info.weights:
            print(f"engine: weights {omni.family.info.weights}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the client, which raises it
        traceback.print_exc()
        outbox.send(pack(Fatal(f"{type(e).__name__}: {e}")))
        ctx.destroy(linger=1000)
        sys.exit(1)
    endpoint = remote.getsockopt_string(zmq.LAST_ENDPOINT) if remote is not None else None
    outbox.send(pack(Ready(dataclasses.asdict(omni.family.info), omni.adapters, endpoint)))
    try:
        _EngineLoop(omni, inbox, outbox, remote).run()
    except Exception as e:  # noqa: BLE001 - a fault outside any request: the server exits, a supervisor restarts it
        traceback.print_exc()
        outbox.send(pack(Fatal(f"{type(e).__name__}: {e}")))
        ctx.destroy(linger=1000)
        sys.exit(1)  # (tensor-parallel workers are daemon processes: they go with this one)
    omni.close()
    ctx.destroy(linger=1000)


class _EngineLoop:
    def __init__(self, omni, inbox: zmq.Socket, outbox: zmq.Socket, remote: zmq.Socket | None = None):
        self.omni, self.inbox, self.outbox, self.remote = omni, inbox, outbox, remote
        self.poller = zmq.Poller()
        for socket in (inbox, remote) if remote is not None else (inbox,):
            self.poller.register(socket, zmq.POLLIN)
        self.active: dict[str, EngineRequest] = {}
        self.clients: dict[str, bytes] = {}  # a remote client's request id -> its connection
        self.interval = omni.config.engine.stream_interval
        self.held: dict[str, list[str]] = {}  # id -> its text pieces not sent yet (stream_interval)
        self.frames: dict[bytes | None, list] = {}  # client (None: the engine's own) -> messages for it, this step
        # id -> (sent, received, added) until its first output
        self.arrivals: dict[str, tuple[float, float, float]] = {}
        self.last_stats, self.was_busy = 0.0, True  # report the idle state once at start

    def run(self) -> None:
        while True:
            timeout = 0 if self.omni.engine.has_unfinished() else IDLE_POLL_MS
            while ready := dict(self.poller.poll(timeout)):
                if self.inbox in ready and not all(self._handle(msg) for msg in unpack(self.inbox.recv())):
                    return
                if self.remote in ready:
                    client, data = self.remote.recv_multipart()
                    for msg in unpack(data):
                        self._handle_remote(client, msg)
                timeout = 0
            busy = self.omni.engine.has_unfinished()
            if busy:
                self.omni.step()
            self._flush()
            self._send_stats(busy)

    def _send_stats(self, busy: bool) -> None:
        """Engine occupancy for /metrics: at most every STATS_INTERVAL_S while busy, once on idle."""
        now = time.monotonic()
        if (busy and now - self.last_stats >= STATS_INTERVAL_S) or (not busy and self.was_busy):
            self.outbox.send(pack(Stats(self.omni.engine.stats())))
            self.last_stats = now
        self.was_busy = busy

    def _handle(self, msg) -> bool:
        if isinstance(msg, Shutdown):
            return False
        if isinstance(msg, Abort):
            self.omni.abort(msg.id)
        elif isinstance(msg, AdapterCall):
            self._adapter_call(msg)
        elif isinstance(msg, Add):
            request, received = msg.request, time.monotonic()
            try:
                req = self.omni.add(request)
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                self._send_error(request.get("request_id"), e)
            else:
                self.active[req.id] = req
                self.arrivals[req.id] = (msg.sent_at or received, received, time.monotonic())
        return True

    def _handle_remote(self, client: bytes, msg) -> None:
        """A remote client's message: its requests and their aborts only."""
        if isinstance(msg, Add) and (rid := msg.request.get("request_id")):
            self.clients[rid] = client
            self._handle(msg)
        elif isinstance(msg, Abort) and self.clients.get(msg.id) == client:
            self.omni.abort(msg.id)

    def _send(self, rid: str | None, message) -> None:
        """``message`` of request ``rid`` for its client (a remote one's end also for the engine's own client),
        sent with the step's others by ``_post``."""
        client = self.clients.get(rid) if rid is not None else None
        self.frames.setdefault(client, []).append(message)
        if client is not None and isinstance(message, (Finished, Failed)):
            del self.clients[rid]
            self.frames.setdefault(None, []).append(Ended(rid))

    def _post(self) -> None:
        """One frame to each client with messages (remote clients first: an Ended follows its request's end)."""
        own = self.frames.pop(None, None)
        for client, messages in self.frames.items():
            self.remote.send_multipart([client, pack(*messages)])
        if own:
            self.outbox.send(pack(*own))
        self.frames.clear()

    def _adapter_call(self, msg: AdapterCall) -> None:
        """Load or unload an adapter between steps (an unloaded one's requests finish with it)."""
        try:
            if msg.action == "load":
                self.omni.load_adapter(msg.name, msg.path)
            else:
                self.omni.unload_adapter(msg.name)
        except Exception as e:  # noqa: BLE001 - a bad adapter fails its call alone
            bad = isinstance(e, InvalidRequestError)
            reply = AdapterReply(msg.id, self.omni.adapters, str(e), type(e).__name__, bad, getattr(e, "param", None))
        else:
            reply = AdapterReply(msg.id, self.omni.adapters)
        self.outbox.send(pack(reply))

    def _flush(self) -> None:
        for rid, req in list(self.active.items()):
            while req.events:
                event = req.events.popleft()
                if event.kind == "text":
                    held = self.held.setdefault(rid, [])
                    held.append(event.data)
                    if len(held) >= self.interval or rid in self.arrivals:  # (the first output goes at once)
                        self._release(rid)
                    continue
                self._release(rid)  # (held text goes before the audio or the end that follows it)
                if event.kind == "audio":
                    self._send(rid, Delta(rid, event.kind, event.data, self._timing(rid)))
                elif event.kind == "error":
                    self._send_error(rid, event.data)
                    self._forget(rid)
                elif event.kind == "finished":
                    self._send(rid, Finished(rid, self._output(req), req.stage_starts()))
                    self._forget(rid)
                    break
        self._post()

    def _release(self, rid: str) -> None:
        """Request ``rid``'s held text as one Delta."""
        if held := self.held.pop(rid, None):
            self._send(rid, Delta(rid, "text", "".join(held), self._timing(rid)))

    def _timing(self, rid: str) -> dict | None:
        """For a request's first output: its time in the inbox (the engine finishing a step), in
        ``Omni.add`` and from there to this output."""
        if (arrival := self.arrivals.pop(rid, None)) is None:
            return None
        (sent, received, added), now = arrival, time.monotonic()
        return {"inbox": received - sent, "add": added - received, "engine": now - added, "flushed_at": now}

    def _forget(self, rid: str) -> None:
        del self.active[rid]
        self.arrivals.pop(rid, None)
        self.held.pop(rid, None)
        self.clients.pop(rid, None)

    def _output(self, req: EngineRequest) -> dict:
        """The request's output, with its logprob tokens as text."""
        out, decode = self.omni.output(req), self.omni.family.decode
        picks, message = out.logprobs, dataclasses.asdict(dataclasses.replace(out, logprobs=None))
        message.pop("logprobs")
        if picks is not None:
            text = lambda token_id: decode([int(token_id)])  # noqa: E731
            top = lambda p: [(text(t), lp) for t, lp in p.top]  # noqa: E731
            message["logprobs"] = [{"token": text(p.token_id), "logprob": p.logprob, "top": top(p)} for p in picks]
        return message

    def _send_error(self, rid: str | None, error: BaseException) -> None:
        bad_request = isinstance(error, InvalidRequestError)
        param = error.param if bad_request else None
        self._send(rid, Failed(rid, str(error), type(error).__name__, bad_request, param))
