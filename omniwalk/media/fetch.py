"""Media referenced by URL or path: refused unless the operator allowed the source.

Remote http(s) URLs need ``MediaLimits.allow_remote_urls``. They are fetched asynchronously
(``fetch_remote``; the HTTP server awaits it, so a slow URL holds up only its own request) within
``fetch_timeout_s`` and ``max_input_bytes``. Every hop is checked before it is contacted:

- the host must resolve only to public addresses: loopback, link-local, private, shared,
  multicast and reserved ranges are refused unless a network in ``fetch_allow_networks`` holds them;
- the connection goes to the address that was checked (the host name only travels as the Host
  header and TLS server name), so a second DNS answer cannot swap in another target;
- redirects are followed by hand, at most ``MAX_REDIRECTS``, each target checked the same way.

Error texts are generic: nothing of the upstream answer (status, body, resolver errors) is
echoed. Local paths (plain or ``file://``) need ``MediaLimits.local_media_dir`` and must resolve
inside it (no ``..`` or symlink escapes).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from omniwalk.errors import InvalidRequestError
from omniwalk.media.errors import MediaLimitError
from omniwalk.media.limits import MediaLimits

MAX_REDIRECTS = 3


def is_remote(url: str) -> bool:
    return urlsplit(url).scheme in ("http", "https")


def fetch(url: str, where: str, limits: MediaLimits) -> bytes:
    """Blocking form (offline ``Omni``): a remote URL is fetched by ``fetch_remote`` on its own loop."""
    if is_remote(url):
        return asyncio.run(fetch_remote(url, where, limits))
    return read_local(url, where, limits)


def read_local(url: str, where: str, limits: MediaLimits) -> bytes:
    scheme = urlsplit(url).scheme
    if scheme not in ("", "file"):
        raise InvalidRequestError(f"{where}: unsupported URL scheme {scheme!r}")
    if limits.local_media_dir is None:
        raise InvalidRequestError(f"{where}: local paths are not read by this server (send a data: URL)")
    path = unquote(urlsplit(url).path) if scheme == "file" else url
    if "\0" in path:
        raise InvalidRequestError(f"{where}: the path contains a NUL character")
    root = Path(limits.local_media_dir).resolve()
    target = (root / path).resolve()  # an absolute path stays absolute
    if not target.is_relative_to(root):
        raise InvalidRequestError(f"{where}: the path is outside the allowed media directory")
    if not target.is_file():
        raise InvalidRequestError(f"{where}: no such file in the media directory")
    if target.stat().st_size > limits.max_input_bytes:
        raise MediaLimitError(f"{where}: the file is larger than {limits.max_input_bytes} bytes")
    return target.read_bytes()


async def fetch_remote(url: str, where: str, limits: MediaLimits) -> bytes:
    if not limits.allow_remote_urls:
        raise InvalidRequestError(f"{where}: remote URLs are not fetched by this server (send a data: URL)")
    try:
        async with asyncio.timeout(limits.fetch_timeout_s):
            return await _follow(url, where, limits)
    except TimeoutError:
        raise InvalidRequestError(f"{where}: fetching the URL timed out") from None


async def _follow(url: str, where: str, limits: MediaLimits) -> bytes:
    import httpx

    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            request = await _pinned_request(client, url, where, limits)
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError:
                raise InvalidRequestError(f"{where}: could not fetch the URL") from None
            try:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise InvalidRequestError(f"{where}: could not fetch the URL")
                return await _read_capped(response, where, limits.max_input_bytes)
            except httpx.HTTPError:
                raise InvalidRequestError(f"{where}: could not fetch the URL") from None
            finally:
                await response.aclose()
    raise InvalidRequestError(f"{where}: too many redirects")


async def _pinned_request(client, url: str, where: str, limits: MediaLimits):
    """A request to ``url`` that connects to the checked address of its host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(f"{where}: only http(s) URLs are fetched")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidRequestError(f"{where}: the URL has an invalid port") from None
    address = await _checked_address(parts.hostname, port, where, limits)
    host = f"[{address}]" if address.version == 6 else str(address)
    pinned = parts._replace(netloc=f"{host}:{port}").geturl()
    netloc_host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    headers = {"Host": netloc_host if parts.port is None else f"{netloc_host}:{port}"}
    return client.build_request("GET", pinned, headers=headers, extensions={"sni_hostname": parts.hostname})


async def _checked_address(host: str, port: int, where: str, limits: MediaLimits):
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise InvalidRequestError(f"{where}: could not resolve the URL's host") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not addresses or not all(is_allowed_address(a, limits) for a in addresses):
        raise InvalidRequestError(f"{where}: the URL's host is not an allowed address")
    return addresses[0]


def is_allowed_address(address, limits: MediaLimits) -> bool:
    """Public unicast addresses, or ones inside an allow-listed network."""
    if getattr(address, "ipv4_mapped", None) is not None:
        address = address.ipv4_mapped
    networks = [ipaddress.ip_network(n, strict=False) for n in limits.fetch_allow_networks]
    if any(address.version == n.version and address in n for n in networks):
        return True
    return address.is_global and not address.is_multicast


async def _read_capped(response, where: str, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise MediaLimitError(f"{where}: the resource is larger than {max_bytes} bytes")
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) > max_bytes:
            raise MediaLimitError(f"{where}: the resource is larger than {max_bytes} bytes")
    return bytes(data)
