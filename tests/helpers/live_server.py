"""``omniwalk serve`` in a subprocess as users run it (its own process group, ready when /health
answers), on a free port, and a PNG data URL for image parts."""

import base64
import io
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

import numpy as np
from helpers.qwen3_omni import checkpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*flags: str, entry=("-m", "omniwalk.cli", "serve"), model=None, env=None) -> tuple[subprocess.Popen, str]:
    """Start the server in its own process group (as a terminal would) and wait for /health."""
    port = free_port()
    cmd = [sys.executable, *entry, "--model", str(model or checkpoint("tiny")), "--port", str(port), *flags]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        try:
            if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                return proc, base
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not become ready")
        time.sleep(0.5)


def engine_pids(server_pid: int) -> list[int]:
    """The server's engine processes (multiprocessing spawns them: ``spawn_main`` in their command
    line), oldest first; /health shows no process ids."""
    ps = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(server_pid)], capture_output=True, text=True)
    return sorted(int(line.split()[0]) for line in ps.stdout.splitlines() if "spawn_main" in line)


@contextmanager
def server(*flags: str, entry=("-m", "omniwalk.cli", "serve")):
    proc, base = launch(*flags, entry=entry)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def png_data_url(image: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
