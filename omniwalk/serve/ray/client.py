"""The ingress side of the engine deployment: ``Replicas``' interface over a ``DeploymentHandle``, so the
HTTP app (``create_app``) runs unchanged in a Ray Serve ingress replica.

    engines = RayEngines(handle, ray_cfg)
    await engines.start()                          # the model's ModelInfo, from an engine replica
    async for event in engines.generate(request):  # wire.Delta ..., then wire.Finished

A request is one streaming call of ``EngineReplica.generate`` (each item a list of events, see
``engine.py``), routed by ``router.AffinityRouter`` with the request's affinity key (the caller's:
a realtime session's id, a chat's prefix digest; else the digest of the engine request's own
messages). Faults: a replica whose engine process is gone (a ``Gone`` event) or whose actor
died is avoided from then on; the request is sent again to another replica, for up to
``ray_retry_timeout_s``, while its client has seen none of its output: a stream (``stream`` set:
streamed chats, realtime responses) before its first delta, a collected request (a non-streamed
chat, speech) until its Finished, whose output is all its consumer reads. A stream that had output
ends with ``EngineUnavailableError`` (the SSE error event, or the realtime error event). Ray
replaces the failed replica (its health check fails); the endpoint stays up, so ``watch`` has
nothing to do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from omniwalk.config import RayConfig
from omniwalk.models.family import ModelInfo
from omniwalk.serve.engine_client import EngineRequestError, EngineUnavailableError
from omniwalk.serve.ray.engine import Gone, Report
from omniwalk.serve.routing import affinity_key
from omniwalk.serve.wire import Delta, Failed, Finished

_REPLICA_LOST = (RayActorError, ActorUnavailableError)
MAX_RETRY_DELAY_S = 1.0


class _ReplicaGone(Exception):
    def __init__(self, replica: str | None, reason: str):
        super().__init__(reason)
        self.replica = replica


class RayEngines:
    def __init__(self, handle, cfg: RayConfig):
        self.handle, self.cfg = handle, cfg
        self.calls = handle.options(stream=True).generate
        self.info: ModelInfo | None = None
        self.reports: dict[str, dict] = {}  # replica id -> its latest stats (``Report``)
        self.gone: dict[str, str] = {}  # replica id -> why (ids are not reused: Ray's replacement has a new one)
        self.unavailable: str | None = None  # set by ``fail_all``: every later request fails
        self.num_retries = 0

    async def start(self) -> None:
        """The model's description, from the first engine replica that is up."""
        self.info = await self.handle.info.remote()

    def watch(self, on_all_dead: Callable[[str], None]) -> None:
        """(Ray replaces a failed engine replica: the ingress never exits for one.)"""

    def fail_all(self, reason: str) -> None:
        self.unavailable = self.unavailable or reason

    @property
    def adapters(self) -> tuple[str, ...]:
        """LoRA adapters are not served through Ray yet (requests naming one get a 404 ``model_not_found``)."""
        return ()

    async def adapter_call(self, action: str, name: str, path: str | None = None) -> None:
        """Run-time adapter loading is refused through Ray (a 400 naming ``lora_name``)."""
        message = "LoRA adapters are not served through Ray yet: serve them with `omniwalk serve --lora`"
        raise EngineRequestError(message, "InvalidRequestError", bad_request=True, param="lora_name")

    async def generate(self, request: dict, key: str | None = None) -> AsyncIterator[Delta | Finished]:
        """The request's events from one engine replica; sent again elsewhere while its client saw none.
        ``key``: its affinity key (``routing.affinity_key``); None: the digest of its own messages."""
        key = key if key is not None else affinity_key(request)
        deadline, delay = time.monotonic() + self.cfg.ray_retry_timeout_s, 0.05
        while True:
            if self.unavailable:
                raise EngineUnavailableError(self.unavailable)
            stream, produced, ended = self.calls.remote(request, key=key, avoid=tuple(self.gone)), False, False
            try:
                async for batch in stream:
                    for event in batch:
                        if not isinstance(event, (Delta, Finished)):
                            self._note(event, request)
                            continue
                        produced, ended = True, isinstance(event, Finished)  # (its replica's stream ends there)
                        yield event
                ended = True
                return
            except (_ReplicaGone, *_REPLICA_LOST) as e:
                ended = True
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                if isinstance(e, _ReplicaGone) and e.replica is not None:
                    self.gone[e.replica] = reason
                    self.reports.pop(e.replica, None)
                if (produced and request.get("stream")) or time.monotonic() > deadline:
                    raise EngineUnavailableError(f"the engine replica failed: {reason}") from None
            except RayTaskError as e:
                raise EngineRequestError(str(e.cause), type(e.cause).__name__, bad_request=False) from None
            finally:
                if not ended:  # (its consumer left early, e.g. a client hung up: stop it, which aborts it there)
                    stream.cancel()
            self.num_retries += 1
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_DELAY_S)

    def _note(self, event, request: dict) -> None:
        """A control event of the stream: a report is kept; a failure is raised."""
        if isinstance(event, Report):
            self.reports[event.replica] = event.stats
        elif isinstance(event, Failed):
            raise EngineRequestError(event.error, event.error_type, event.bad_request, event.param)
        elif isinstance(event, Gone):
            raise _ReplicaGone(event.replica, event.reason)

    @property
    def stats(self) -> dict[str, dict]:
        """Per engine replica (by Ray replica id): its latest stats, as of its last finished request here."""
        return dict(self.reports)

    def health(self) -> list[dict]:
        return [{"replica": name, "status": "ready"} for name in self.reports]

    def close(self) -> None:
        """(The engine replicas are Ray's: they outlive an ingress replica.)"""
