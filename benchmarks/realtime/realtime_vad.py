"""The realtime server VAD's cost per 20 ms frame of microphone audio, on the CPU of the HTTP process.

    PYTHONPATH=$PWD python benchmarks/realtime/realtime_vad.py [--seconds 60] [--rounds 5]

A stream of speech-like audio and quiet (PCM16 at 24 kHz) is fed in 100 ms chunks, as a browser
sends it, to what a session runs on every append: ``TurnDetector.feed`` (soxr resampling to 16 kHz,
the WebRTC VAD per 20 ms frame, the vote). Also timed: the WebRTC VAD call alone, and, for
comparison when the package is importable (it is not a dependency), Silero VAD's JIT model on
its 32 ms windows in one torch thread, scaled to 20 ms.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import webrtcvad

from omniwalk.bench.workload import speech_like
from omniwalk.serve.realtime.vad import FRAME_SAMPLES, INPUT_RATE, TurnDetector, VADParams


def stream(seconds: float) -> np.ndarray:
    rng, parts, t = np.random.default_rng(0), [], 0.0
    while t < seconds:  # 2 s of speech, 1 s of quiet, ...
        parts += [speech_like(2.0, int(t), INPUT_RATE), 0.003 * rng.standard_normal(INPUT_RATE)]
        t += 3.0
    return (np.clip(np.concatenate(parts)[: int(seconds * INPUT_RATE)], -1, 1) * 32767).astype(np.int16)


def best_of(rounds: int, fn) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    audio = stream(args.seconds)
    num_frames = len(audio) // FRAME_SAMPLES
    chunks = [audio[i : i + 2400] for i in range(0, len(audio), 2400)]

    def detector():
        d = TurnDetector(VADParams())
        for c in chunks:
            d.feed(c)

    import soxr

    pcm16k = soxr.resample(audio, INPUT_RATE, 16000)
    frames16k = [pcm16k[i : i + 320].tobytes() for i in range(0, len(pcm16k) - 319, 320)]
    vad = webrtcvad.Vad(3)

    def webrtc_only():
        for f in frames16k:
            vad.is_speech(f, 16000)

    feed_us = best_of(args.rounds, detector) / num_frames * 1e6
    call_us = best_of(args.rounds, webrtc_only) / len(frames16k) * 1e6
    print(f"{args.seconds:.0f} s of audio, {num_frames} frames of 20 ms, best of {args.rounds}:")
    print(f"  TurnDetector.feed (resample + WebRTC VAD + vote): {feed_us:.1f} us/frame")
    print(f"  WebRTC VAD call alone:                           {call_us:.1f} us/frame")
    try:
        import torch
        from silero_vad import load_silero_vad
    except ImportError:
        return
    torch.set_num_threads(1)
    model = load_silero_vad()
    windows = [
        torch.from_numpy(pcm16k[i : i + 512].astype(np.float32) / 32768) for i in range(0, len(pcm16k) - 511, 512)
    ]

    def silero():
        model.reset_states()
        for w in windows[:500]:
            model(w, 16000)

    per_window = best_of(max(1, args.rounds // 2), silero) / 500
    print(f"  Silero VAD (JIT, 1 thread), for comparison:      {per_window * 20 / 32 * 1e6:.1f} us per 20 ms of audio")


if __name__ == "__main__":
    main()
