"""Media referenced by URL or path: refused unless the operator allowed the source.

Remote http(s) URLs need ``MediaLimits.allow_remote_urls`` and are read with a timeout and a
size cap; local paths (plain or ``file://``) need ``MediaLimits.local_media_dir`` and must
resolve inside it (no ``..`` or symlink escapes).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from omniwalk.errors import InvalidRequestError
from omniwalk.media.errors import MediaLimitError
from omniwalk.media.limits import MediaLimits


def fetch(url: str, where: str, limits: MediaLimits) -> bytes:
    scheme = urlparse(url).scheme
    if scheme in ("http", "https"):
        if not limits.allow_remote_urls:
            raise InvalidRequestError(f"{where}: remote URLs are not fetched by this server (send a data: URL)")
        return _read_remote(url, where, limits)
    if scheme in ("", "file"):
        if limits.local_media_dir is None:
            raise InvalidRequestError(f"{where}: local paths are not read by this server (send a data: URL)")
        return _read_local(unquote(urlparse(url).path) if scheme == "file" else url, where, limits)
    raise InvalidRequestError(f"{where}: unsupported URL scheme {scheme!r}")


def _read_remote(url: str, where: str, limits: MediaLimits) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=limits.fetch_timeout_s) as response:
            data = response.read(limits.max_input_bytes + 1)
    except (urllib.error.URLError, TimeoutError, ValueError) as e:
        raise InvalidRequestError(f"{where}: could not fetch {url}: {e}") from None
    if len(data) > limits.max_input_bytes:
        raise MediaLimitError(f"{where}: {url} is larger than {limits.max_input_bytes} bytes")
    return data


def _read_local(path: str, where: str, limits: MediaLimits) -> bytes:
    root = Path(limits.local_media_dir).resolve()
    target = (root / path).resolve()  # an absolute path stays absolute
    if not target.is_relative_to(root):
        raise InvalidRequestError(f"{where}: {path} is outside the allowed media directory")
    if not target.is_file():
        raise InvalidRequestError(f"{where}: no such file {path}")
    if target.stat().st_size > limits.max_input_bytes:
        raise MediaLimitError(f"{where}: {path} is larger than {limits.max_input_bytes} bytes")
    return target.read_bytes()
