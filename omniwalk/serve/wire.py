"""The messages between the HTTP process and the engine process, and their msgpack framing.

    HTTP -> engine   Add(request, sent_at) | Abort(id) | Shutdown() | AdapterCall(id, action, name, path)
    engine -> HTTP   Ready(info, adapters, endpoint) once the model is loaded (Fatal(error) if it fails to), then
                     per request Delta(id, "text" | "audio", data, timing on the first)..., and Finished(id, output)
                     or Failed(id, error, error_type, bad_request, param); Stats(data) now and then;
                     AdapterReply(id, adapters, error, ...) per AdapterCall; Fatal(error) before the process exits
                     on a fault outside any request

A remote client (a Ray ingress, ``serve/ray/``) sends Add and Abort to the engine's ``endpoint`` and gets
its requests' Deltas and Finished or Failed there; the engine's own client then gets Ended(id) for each.

Every ZMQ frame holds a list of messages: the engine sends each client the Deltas, Finished and Faileds of
one step in one frame (with ``stream_interval`` > 1, a request's text pieces wait for that many, its first
excepted, and go as one Delta).

A request and an output are plain dicts (``omni.py``'s request keys, ``RequestOutput``'s fields);
numpy arrays and torch tensors in them (media inputs, audio chunks, codes) travel as raw bytes
with dtype and shape, never as Python lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np
import torch

_ARRAY = "__ndarray__"


@dataclass
class Add:
    request: dict
    sent_at: float = 0.0  # time.monotonic() when sent (one clock for both processes on one host)


@dataclass
class Abort:
    id: str


@dataclass
class Shutdown:
    pass


@dataclass
class Ready:
    info: dict  # ``ModelInfo`` fields
    adapters: list[str] = field(default_factory=list)  # the LoRA adapters requests may name as their model
    endpoint: str | None = None  # where remote clients connect (the engine's ``data_host``), if it listens


@dataclass
class AdapterCall:
    """Load (``path``: a PEFT directory the HTTP process checked) or unload a LoRA adapter."""

    id: str
    action: str  # "load" | "unload"
    name: str
    path: str | None = None


@dataclass
class AdapterReply:
    id: str
    adapters: list[str]  # the adapters served after the call
    error: str | None = None  # the call failed (nothing changed): why
    error_type: str | None = None
    bad_request: bool = False  # the caller's fault (a bad adapter, an unknown name), not the server's
    param: str | None = None


@dataclass
class Delta:
    id: str
    kind: str  # "text" (a str) or "audio" (float32 PCM at the model's sample rate)
    data: Any
    # on a request's first Delta only: where its time to first output went, in seconds
    # ({"inbox", "add", "engine"}), and "flushed_at" (time.monotonic() when the engine sent it)
    timing: dict | None = None


@dataclass
class Finished:
    id: str
    output: dict  # ``RequestOutput`` fields; logprobs as {"token": text, "logprob", "top": [(text, logprob)]}
    stage_starts: dict[str, float] | None = None  # seconds from entering the engine to each stage's first work


@dataclass
class Failed:
    id: str | None
    error: str
    error_type: str
    bad_request: bool  # the client's fault (a 4xx), not the server's
    param: str | None = None  # the request field at fault, for a bad request that names one


@dataclass
class Fatal:
    error: str


@dataclass
class Ended:
    """A remote client's request finished or failed (sent to the engine's own client)."""

    id: str


@dataclass
class Stats:
    data: dict  # ``Engine.stats()``


MESSAGES = {
    cls.__name__: cls
    for cls in (Add, Abort, Shutdown, Ready, Delta, Finished, Failed, Ended, Fatal, Stats, AdapterCall, AdapterReply)
}


def _default(obj: Any):
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return {_ARRAY: True, "dtype": obj.dtype.str, "shape": list(obj.shape), "data": obj.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__} to the engine")


def _object_hook(obj: dict):
    if obj.get(_ARRAY):
        return np.frombuffer(obj["data"], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    return obj


def pack(*messages) -> bytes:
    """One frame of ``messages`` (the engine sends each client a step's events in one)."""
    bodies = [{"type": type(m).__name__, **{f.name: getattr(m, f.name) for f in fields(m)}} for m in messages]
    return msgpack.packb(bodies, default=_default, use_bin_type=True)


def unpack(data: bytes) -> list:
    """A frame's messages, in their order."""
    bodies = msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)
    return [MESSAGES[body.pop("type")](**body) for body in bodies]
