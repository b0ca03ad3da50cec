"""The server's life as an operator sees it: start-up failures, engine death, client hang-ups,
SIGTERM with requests in flight."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request

import httpx
from helpers.live_server import free_port, launch
from helpers.qwen3_omni import checkpoint

from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint

LONG = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 8000, "ignore_eos": True}


def _serve(*flags, model: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", model, "--port", str(free_port()), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_an_engine_start_up_error_is_printed_and_the_server_exits_non_zero(tmp_path):
    skeleton = make_tiny_checkpoint(tmp_path / "skeleton", with_weights=False)  # no weights: the load fails
    start = time.monotonic()
    proc = _serve(model=str(skeleton))
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1 and time.monotonic() - start < 30, output
    assert "the engine failed to start" in output and "CheckpointError" in output, output


def test_bad_flags_fail_before_anything_starts(tmp_path):
    proc = _serve("--dtype", "float64", model=checkpoint("tiny"))
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 2 and "invalid choice: 'float64'" in output, output
    proc = _serve("--max-running", "0", model=checkpoint("tiny"))
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 2 and "max_running must be >= 1" in output, output


def _engine_pid(server_pid: int) -> int:
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(server_pid)], capture_output=True, text=True)
    pids = [int(p) for p in children.stdout.split()]
    for pid in pids:  # the spawned engine (multiprocessing may also run a resource tracker)
        cmdline = open(f"/proc/{pid}/cmdline").read()
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            return pid
    raise AssertionError(f"no engine process among {pids}")


async def _metric(base: str, *needles: str, timeout: float = 30) -> str:
    """/metrics once all ``needles`` show (or at the timeout): the HTTP counter of a hung-up request is
    written when its handler ends, which may be after the engine has dropped the request."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as h:
        while True:
            text = (await h.get(f"{base}/metrics")).text
            if all(n in text for n in needles) or time.monotonic() > deadline:
                return text
            await asyncio.sleep(0.3)


def test_hang_ups_abort_and_engine_death_fails_requests_and_exits_non_zero():
    proc, base = launch()
    url = f"{base}/v1/chat/completions"

    async def scenario():
        # a non-streaming client that gives up: its request is aborted in the engine
        async with httpx.AsyncClient(timeout=1.0) as h:
            try:
                await h.post(url, json=LONG)
                raise AssertionError("a request of 8000 tokens finished within 1 s")
            except httpx.ReadTimeout:
                pass
        idle = 'omniwalk_engine{quantity="requests",replica="0",stage="engine"} 0.0'
        hung_up = 'completions",status="499"}'
        metrics = await _metric(base, idle, hung_up)
        assert 'omniwalk_engine{quantity="requests",replica="0",stage="engine"} 0.0' in metrics
        assert 'route="/v1/chat/completions",status="499"} 1.0' in metrics
        # the engine process dies with requests in flight: each fails with 503 at once
        async with httpx.AsyncClient(timeout=60) as h:
            flying = [asyncio.create_task(h.post(url, json=LONG)) for _ in range(3)]
            await asyncio.sleep(1.0)
            os.kill(_engine_pid(proc.pid), signal.SIGKILL)
            killed = time.monotonic()
            replies = await asyncio.gather(*flying)
            return replies, time.monotonic() - killed

    replies, seconds = asyncio.run(scenario())
    for r in replies:
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
    assert seconds < 5
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 1 and "the engine process exited with code -9" in output, output


def test_sigterm_drains_requests_in_flight_then_aborts_the_rest():
    proc, base = launch("--shutdown-grace-s", "10")
    url = f"{base}/v1/chat/completions"
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "ignore_eos": True}

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as h:
            flying = [asyncio.create_task(h.post(url, json=body)) for body in (short, short, LONG)]
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            replies = await asyncio.gather(*flying)
            return replies, time.monotonic() - sent

    (first, second, long), seconds = asyncio.run(scenario())
    for r in (first, second):
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
    assert long.status_code == 503 and "shutting down" in long.json()["error"]["message"], long.text
    assert 9 < seconds < 30
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and output.rstrip().endswith("stopped"), output
    try:
        urllib.request.urlopen(f"{base}/health", timeout=2)
        raise AssertionError("still serving")
    except OSError:
        pass
