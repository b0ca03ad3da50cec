"""Live servers and what the tests send them: ``omniwalk serve`` in a subprocess as users run it (its own
process group, ready when /health answers), on a free port, and a PNG data URL for image parts.

The realtime tests' reading of a session through the official SDK's connection.

Hostile and unsupported request bodies with the answer each must get (status, param, code), media
that decodes to far more than its size (bombs) or for long (a client's hang-up comes first), and a
process's resident memory."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

import httpx
import numpy as np
import soundfile as sf
from helpers.qwen3_omni import checkpoint
from PIL import Image


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


async def until(conn, last: str = "response.done", timeout: float = 120) -> list:
    """Server events up to and including the first of type ``last``."""
    events = []

    async def read():
        async for event in conn:
            events.append(event)
            if event.type == last:
                return

    await asyncio.wait_for(read(), timeout)
    return events


USER = [{"role": "user", "content": "hi"}]


SPEECH = {"modalities": ["text", "audio"], "max_audio_frames": 2, "talker_temperature": 0.0}


def _part(part: dict) -> dict:
    return {"messages": [{"role": "user", "content": [part]}]}


BAD = "invalid_value"


# (body, status, param, code); the issue's list first, then unsupported OpenAI features
HOSTILE = [
    ({"messages": USER, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"messages": USER, "modalities": ["text", "audio"], "audio": {"voice": 5}}, 400, "audio.voice", "invalid_type"),
    ({"messages": USER, "stop": 5}, 400, "stop", "invalid_type"),
    ({"messages": USER, "modalities": [1, "text"]}, 400, "modalities[0]", "invalid_value"),
    ({"messages": USER, "stream_options": "yes"}, 400, "stream_options", "invalid_type"),
    ({"messages": USER, "audio": {"format": []}}, 400, "audio.format", "invalid_value"),
    (_part({"type": "audio", "audio": [[0.1, 0.2], [0.3]]}), 400, "messages[0].content[0]", "invalid_value"),
    ({"messages": USER, "seed": 2**64 - 1}, 400, "seed", "invalid_value"),
    ({"messages": USER, "seed": 10**30}, 400, "seed", "invalid_value"),
    (_part({"type": "image_url", "image_url": {"url": "/tmp/a\0.png"}}), 400, "messages[0].content[0].image_url", BAD),
    ({"messages": USER, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": 2**40}, 400, "max_tokens", "invalid_value"),
    ({"messages": USER, "tools": [{"type": "function"}]}, 400, "tools[0].function", "missing_required_parameter"),
    ({"messages": USER, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    ({"messages": USER, "n": 2}, 400, "n", "unsupported_value"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id", "missing_required_parameter"),
    ({"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role", "unsupported_parameter"),
    ({"messages": USER, "bogus": 1}, 400, "bogus", "unknown_parameter"),
    ({"messages": []}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0]", "invalid_value"),
    ({"messages": [{"role": "assistant", "audio": {"id": "audio_nope"}}]}, 400, "messages[0].audio.id", BAD),
    ([1, 2], 400, None, "invalid_type"),
]


RAW = [
    (b"[" * 100_000 + b"]" * 100_000, 400, None, "invalid_json"),  # nesting beyond the parser's bound
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None, "invalid_json"),
    (b"", 400, None, "invalid_json"),
]


def metric(base: str, name: str, **labels) -> float:
    """A metric's value from the server's /metrics (0 for a counter before its first increment: it
    has no series yet)."""
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith((f"{name}{{", f"{name} ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.split()[-1])
    return 0.0


def rss_mb(pid: int) -> float:
    line = next(line for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def solid_video(width: int, height: int, num_frames: int, fps: int) -> bytes:
    """An H.264 MP4 of one colour: a few bytes a frame, however many pixels."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 90, np.uint8), format="rgb24")
        for _ in range(num_frames):
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return buf.getvalue()


@functools.cache
def slow_video() -> bytes:
    """40,000 frames of 64x64 at 200 fps (~0.5 MB; 200 s, 400 frames kept, ~180 MB resized: within
    every limit): seconds of decoding, so a client hangs up long before it is done."""
    return solid_video(64, 64, 40_000, fps=200)


def silent_flac(seconds: int, rate: int, channels: int) -> bytes:
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        block = np.zeros((rate * 10, channels), np.int16)
        for _ in range(seconds // 10):
            f.write(block)
    return buf.getvalue()


def one_colour_png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(buf, format="PNG")
    return buf.getvalue()


def media_body(kind: str, mime: str, data: bytes) -> dict:
    """A one-token chat body asking about one media part of ``kind`` ("image", "video", "audio")."""
    url = f"data:{mime};base64," + base64.b64encode(data).decode()
    part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is it?"}]}], "max_tokens": 1}


@functools.cache
def media_bombs(audio_seconds: int = 600) -> tuple[tuple[str, str, bytes, str], ...]:
    """(kind, mime, bytes, the limit named in the 400) of each media bomb: 200 frames of 720p video
    in ~10 KB, ``audio_seconds`` of 96 kHz x 8-channel FLAC (past the default audio budget from 88 s),
    a 7000x7000 PNG in ~160 KB."""
    return (
        ("video", "video/mp4", solid_video(1280, 720, 200, fps=1), "max_video_decoded_bytes"),  # all 200 frames kept
        ("audio", "audio/flac", silent_flac(audio_seconds, 96000, 8), "max_audio_decoded_bytes"),
        ("image", "image/png", one_colour_png(7000), "max_image_decoded_bytes"),
    )
