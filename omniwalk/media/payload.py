"""A content part's media bytes (or array): inline array, base64 payload, ``data:`` URL, or an
allowed URL/path (``fetch.py``)."""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omniwalk.errors import InvalidRequestError
from omniwalk.media.fetch import fetch
from omniwalk.media.limits import MediaLimits


def part_payload(part: dict, array_key: str, base64_key: str | None, url_key: str, limits: MediaLimits):
    """The part's array, base64 ``input_audio.data`` or ``data:`` URL bytes."""
    if part.get(array_key) is not None:
        return np.asarray(part[array_key])
    if base64_key and isinstance(part.get(base64_key), dict):
        return b64decode(part[base64_key].get("data"), base64_key)
    url = part.get(url_key)
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str):
        raise InvalidRequestError(f"{url_key} must be a URL string or {{'url': ...}}")
    if url.startswith("data:"):
        if ";base64," not in url:
            raise InvalidRequestError(f"{url_key}: data: URLs must carry base64 content")
        return b64decode(url.split(";base64,", 1)[1], url_key)
    return fetch(url, url_key, limits)


def b64decode(data, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise InvalidRequestError(f"{where}: content is not valid base64") from None
