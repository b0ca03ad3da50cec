"""Media by URL or path: refused by default; allowed sources are read within limits."""

import contextlib
import http.server
import threading
from dataclasses import replace

import pytest

from omniwalk.errors import InvalidRequestError
from omniwalk.media.errors import MediaLimitError
from omniwalk.media.fetch import fetch
from omniwalk.media.limits import MediaLimits

DEFAULT = MediaLimits()


def test_remote_urls_and_local_paths_are_refused_by_default(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    with pytest.raises(InvalidRequestError, match="remote URLs are not fetched"):
        fetch("https://example.invalid/a.wav", "audio_url", DEFAULT)
    with pytest.raises(InvalidRequestError, match="local paths are not read"):
        fetch(str(tmp_path / "a.wav"), "audio_url", DEFAULT)
    with pytest.raises(InvalidRequestError, match="unsupported URL scheme"):
        fetch("ftp://host/a.wav", "audio_url", DEFAULT)


def test_local_paths_inside_the_allowed_directory_only(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "a.wav").write_bytes(b"RIFFdata")
    (tmp_path / "secret.txt").write_bytes(b"no")
    limits = replace(DEFAULT, local_media_dir=str(media), max_input_bytes=100)
    assert fetch("a.wav", "audio_url", limits) == b"RIFFdata"
    assert fetch(f"file://{media / 'a.wav'}", "audio_url", limits) == b"RIFFdata"
    for escape in ("../secret.txt", str(tmp_path / "secret.txt"), f"file://{tmp_path / 'secret.txt'}"):
        with pytest.raises(InvalidRequestError, match="outside the allowed media directory"):
            fetch(escape, "audio_url", limits)
    with pytest.raises(InvalidRequestError, match="no such file"):
        fetch("missing.wav", "audio_url", limits)
    (media / "big.wav").write_bytes(b"x" * 101)
    with pytest.raises(MediaLimitError, match="larger than 100 bytes"):
        fetch("big.wav", "audio_url", limits)


def _serve(directory, host: str = "127.0.0.1", redirect_to: str | None = None):
    """A static server over ``directory``; /slow.bin answers only at shutdown or after 30 s (a 1 s fetch of it
    times out however loaded the machine; one that does not time out fails instead of hanging)."""
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(directory), **kwargs)

        def do_GET(self):
            if self.path == "/slow.bin":
                release.wait(30)
            if redirect_to is not None and self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.end_headers()
                return
            with contextlib.suppress(ConnectionError):  # a client that timed out has gone
                super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shutdown = server.shutdown
    server.shutdown = lambda: (release.set(), shutdown())
    return server, f"http://{host}:{server.server_address[1]}"


@pytest.fixture
def http_server(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"hello")
    (tmp_path / "big.bin").write_bytes(b"x" * 1000)
    (tmp_path / "slow.bin").write_bytes(b"x")
    server, base = _serve(tmp_path)
    yield base
    server.shutdown()


# a timeout no loaded machine reaches on loopback; the timeout itself is tested on a server that never answers
LOOPBACK = replace(DEFAULT, allow_remote_urls=True, max_input_bytes=100, fetch_timeout_s=60.0)


def test_remote_urls_when_allowed(http_server):
    limits = replace(LOOPBACK, fetch_allow_networks=("127.0.0.1/32",))
    assert fetch(f"{http_server}/small.bin", "image_url", limits) == b"hello"
    with pytest.raises(MediaLimitError, match="larger than 100 bytes"):
        fetch(f"{http_server}/big.bin", "image_url", limits)
    with pytest.raises(InvalidRequestError, match="could not fetch the URL$") as e:
        fetch(f"{http_server}/missing.bin", "image_url", limits)
    assert "404" not in str(e.value)  # upstream statuses are not echoed
    with pytest.raises(InvalidRequestError, match="timed out"):
        fetch(f"{http_server}/slow.bin", "image_url", replace(limits, fetch_timeout_s=1.0))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/a.png",
        "http://localhost:9/a.png",
        "http://[::1]:9/a.png",
        "http://169.254.169.254/x",
        "http://10.0.0.1/x",
        "http://192.168.1.1/x",
        "http://[::ffff:127.0.0.1]:9/x",
        "http://0.0.0.0:9/x",
    ],
)
def test_private_targets_are_refused_unless_allow_listed(url):
    with pytest.raises(InvalidRequestError, match="not an allowed address"):
        fetch(url, "image_url", LOOPBACK)


def test_a_redirect_to_a_refused_target_is_not_followed(tmp_path):
    """An allow-listed host (127.0.0.2) redirecting to one that is not (127.0.0.1)."""
    (tmp_path / "small.bin").write_bytes(b"hello")
    inner, inner_base = _serve(tmp_path)
    outer, outer_base = _serve(tmp_path, "127.0.0.2", redirect_to=f"{inner_base}/small.bin")
    try:
        limits = replace(LOOPBACK, fetch_allow_networks=("127.0.0.2/32",))
        with pytest.raises(InvalidRequestError, match="not an allowed address"):
            fetch(f"{outer_base}/redirect", "image_url", limits)
        both = replace(LOOPBACK, fetch_allow_networks=("127.0.0.0/8",))
        assert fetch(f"{outer_base}/redirect", "image_url", both) == b"hello"
    finally:
        inner.shutdown()
        outer.shutdown()


def test_a_nul_byte_in_a_local_path_is_a_bad_request(tmp_path):
    limits = replace(DEFAULT, local_media_dir=str(tmp_path))
    with pytest.raises(InvalidRequestError, match="NUL"):
        fetch("a\0.wav", "image_url", limits)
