"""Threads or processes for the HTTP process's media pool: decode throughput and event-loop lag.

    PYTHONPATH=$PWD python benchmarks/media_pool.py [--workers 2] [--rounds 3]

A mixed set (10 s stereo MP3 at 44.1 kHz, a 1920x1080 JPEG, a 10 s 640x360 H.264 video with AAC
audio) is preprocessed (``omniwalk.media.preprocess``) serially, in a thread pool and in a
process pool of ``--workers``; meanwhile an asyncio ticker measures how late the event loop runs
(the HTTP server's latency for everything else while media decodes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from media_samples import encode_audio, encode_image, encode_video, gradient_image, tone  # noqa: E402

from omniwalk.media.patches import IMAGE_PATCHES, VIDEO_PATCHES  # noqa: E402
from omniwalk.media.preprocess import preprocess  # noqa: E402

SPECS = {"image": IMAGE_PATCHES, "video": VIDEO_PATCHES}  # the resizing of the results' runs (the media defaults)


def samples() -> list[tuple[str, bytes]]:
    mp3 = encode_audio(tone(10.0, 44100, 2), 44100, "MP3")
    jpeg = encode_image(gradient_image(1080, 1920), "JPEG", quality=90)
    frames = np.stack([gradient_image(360, 640, seed=i % 7) for i in range(300)])
    mp4 = encode_video(frames, 30, audio=tone(10.0))
    return [("audio", mp3), ("image", jpeg), ("video", mp4)]


def _work(item):
    kind, data = item
    start = time.perf_counter()
    preprocess(kind, data, spec=SPECS.get(kind))
    return time.perf_counter() - start


async def timed(pool, items) -> tuple[float, float]:
    """(wall seconds for all items, worst event-loop lateness in ms)."""
    loop, worst, done = asyncio.get_running_loop(), 0.0, False

    async def ticker():
        nonlocal worst
        while not done:
            t = loop.time()
            await asyncio.sleep(0.002)
            worst = max(worst, loop.time() - t - 0.002)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    if pool is None:
        for item in items:
            _work(item)
    else:
        await asyncio.gather(*(loop.run_in_executor(pool, _work, item) for item in items))
    wall = time.perf_counter() - start
    done = True
    await tick
    return wall, worst * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    items = samples()
    for kind, data in items:
        best = min(_work((kind, data)) for _ in range(3))
        print(f"{kind}: {len(data) / 1e6:.2f} MB, one decode {best * 1000:.0f} ms")
    batches = {"mixed": items * 4, **{kind: [(kind, data)] * 6 for kind, data in items}}
    with ThreadPoolExecutor(args.workers) as threads, ProcessPoolExecutor(args.workers) as procs:
        asyncio.run(timed(procs, items))  # start the workers (imports) outside the measurement
        for label, batch in batches.items():
            for name, pool in (("serial", None), ("threads", threads), ("processes", procs)):
                runs = [asyncio.run(timed(pool, batch)) for _ in range(args.rounds)]
                wall, lag = min(r[0] for r in runs), min(r[1] for r in runs)
                lag_text = "blocks the loop throughout" if pool is None else f"worst loop lag {lag:.0f} ms"
                print(
                    f"{label:6s} {name:10s} {len(batch)} items: {wall:.2f} s ({len(batch) / wall:.1f} items/s), "
                    f"{lag_text}"
                )


if __name__ == "__main__":
    main()
