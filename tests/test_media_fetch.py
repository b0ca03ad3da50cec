"""Media by URL or path: refused by default; allowed sources are read within limits."""

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


@pytest.fixture
def http_server(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"hello")
    (tmp_path / "big.bin").write_bytes(b"x" * 1000)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_remote_urls_when_allowed(http_server):
    limits = replace(DEFAULT, allow_remote_urls=True, max_input_bytes=100, fetch_timeout_s=5.0)
    assert fetch(f"{http_server}/small.bin", "image_url", limits) == b"hello"
    with pytest.raises(MediaLimitError, match="larger than 100 bytes"):
        fetch(f"{http_server}/big.bin", "image_url", limits)
    with pytest.raises(InvalidRequestError, match="could not fetch"):
        fetch(f"{http_server}/missing.bin", "image_url", limits)
