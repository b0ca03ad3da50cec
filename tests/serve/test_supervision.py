"""The server's life as an operator sees it: start-up failures, engine death, client hang-ups,
SIGTERM with requests in flight."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
from helpers.live_server import free_port, launch
from helpers.qwen3_omni import checkpoint

from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint

LONG = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 8000, "ignore_eos": True}
SLOW_MAX_TOKENS = 2001  # helpers/fault_server.py: at least 40 ms a token (not imported: it patches at import)


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


def _unfinished(base: str) -> float:
    """The requests the (single) engine replica holds, from /metrics."""
    metrics = httpx.get(f"{base}/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith('omniwalk_engine{quantity="unfinished",replica="0"'))
    return float(line.rsplit(" ", 1)[1])


async def _until(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_sigterm_drains_requests_in_flight_then_aborts_the_rest():
    """No wall-clock window either way: the slow request (at least 40 ms a token in the fault server, so at
    least 80 s) cannot finish within the 30 s grace on any machine, and the stop signal goes out only once it
    is in the engine and each short one has streamed its first token: what the short ones still have to do
    is two decode steps, which the grace outlasts by orders of magnitude even on a loaded machine."""
    grace = 30
    proc, base = launch("--shutdown-grace-s", str(grace), entry=("-m", "tests.helpers.fault_server"))
    url = f"{base}/v1/chat/completions"
    slow = {"messages": [{"role": "user", "content": "go"}], "max_tokens": SLOW_MAX_TOKENS, "ignore_eos": True}
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True, "stream": True}
    short["stream_options"] = {"include_usage": True}

    async def stream(h: httpx.AsyncClient, started: asyncio.Event) -> tuple[int, int, str]:
        """(status, completion tokens, finish reason) of a streamed chat; ``started`` set at its first token."""
        tokens, finish = 0, None
        async with h.stream("POST", url, json=short) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                assert "error" not in chunk, chunk
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    started.set()
                if chunk["choices"] and chunk["choices"][0].get("finish_reason"):
                    finish = chunk["choices"][0]["finish_reason"]
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
            return r.status_code, tokens, finish

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as h:
            # the marker is the engine's max_tokens: one clipped to the context left would not slow down
            prompt = (await h.post(url, json={**slow, "max_tokens": 1})).json()["usage"]["prompt_tokens"]
            context = json.loads((Path(checkpoint("tiny")) / "config.json").read_text())["thinker_config"]
            assert prompt + SLOW_MAX_TOKENS <= context["text_config"]["max_position_embeddings"], prompt
            long = asyncio.create_task(h.post(url, json=slow))
            await _until(lambda: _unfinished(base) == 1)
            started = [asyncio.Event(), asyncio.Event()]
            shorts = [asyncio.create_task(stream(h, event)) for event in started]
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 60)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            replies = await asyncio.gather(*shorts, long)
            return replies, time.monotonic() - sent

    (first, second, long), seconds = asyncio.run(scenario())
    assert first == second == (200, 3, "length"), (first, second)
    assert long.status_code == 503 and "shutting down" in long.json()["error"]["message"], long.text
    assert seconds >= grace - 0.1  # (the server's grace starts when the signal arrives, after ``sent``)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and output.rstrip().endswith("stopped"), output
    try:
        urllib.request.urlopen(f"{base}/health", timeout=2)
        raise AssertionError("still serving")
    except OSError:
        pass
