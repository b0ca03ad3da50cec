"""/v1/audio/speech of a 12-word text vs the equivalent chat request, on a live server.

    PYTHONPATH=$PWD python benchmarks/speech_vs_chat.py [--rounds 5] [--frames 40]

Equivalent work: the chat request asks for the same voice and the same number of speech frames
(min = max) and generates as many thinker tokens as the speech request's forced answer has
(ignore_eos); the speech request commits its answer after the prefill instead of decoding it.
Prints the median wall time of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_omni_text import checkpoint  # noqa: E402
from test_server import launch  # noqa: E402

from omniwalk.serve.speech import SPEECH_SYSTEM_PROMPT  # noqa: E402
from omniwalk.tokenizer import Tokenizer  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog and runs far away"  # 12 words


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=40)
    args = parser.parse_args()
    proc, base = launch()
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
        num_tokens = len(Tokenizer.from_dir(checkpoint("tiny")).encode(TEXT)) + 1  # + the end of the turn
        speech = {"talker_temperature": 0.0, "min_audio_frames": args.frames, "max_audio_frames": args.frames}
        times = {"speech": [], "chat": []}
        for _ in range(args.rounds + 1):  # the first round warms up
            start = time.perf_counter()
            client.audio.speech.create(model="qwen3-omni", input=TEXT, voice="ethan", response_format="wav",
                                       extra_body=speech)  # fmt: skip
            times["speech"].append(time.perf_counter() - start)
            start = time.perf_counter()
            client.chat.completions.create(
                model="qwen3-omni",
                messages=[{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": TEXT}],
                modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "wav"},
                max_tokens=num_tokens,
                extra_body={"min_tokens": num_tokens, "ignore_eos": True, **speech},
            )
            times["chat"].append(time.perf_counter() - start)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        print(f"{num_tokens} thinker tokens, {args.frames} speech frames, median of {args.rounds}:")
        ratio = med["speech"] / med["chat"]
        print(f"speech {med['speech']:.3f} s, chat {med['chat']:.3f} s, speech / chat = {ratio:.2f}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
