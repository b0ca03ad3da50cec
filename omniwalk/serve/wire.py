"""msgpack framing between the HTTP process and the engine process.

Requests and events are plain dicts; numpy arrays and torch tensors (media inputs, audio chunks,
codes) travel as raw bytes with dtype and shape, never as Python lists.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import torch

_ARRAY = "__ndarray__"


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


def pack(message: dict) -> bytes:
    return msgpack.packb(message, default=_default, use_bin_type=True)


def unpack(data: bytes) -> dict:
    return msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)
