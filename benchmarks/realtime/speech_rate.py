"""Seconds of speech per word: an upper bound of the seconds per text token, which
``ModelConfig.speech_s_per_text_token`` (the talker's cap from its answer's text) must stay above. Every
whitespace-separated word is at least one token of a BPE tokenizer, so seconds per token <= seconds per
word; texts with numbers, symbols and addresses (said as many words each) are included. Texts said by
espeak-ng at a conversational and a slow rate.

    python benchmarks/realtime/speech_rate.py [--out benchmarks/results/cpu/speech_rate.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]  # the repository root
from benchmarks.realtime.speech_turns import PHRASES  # noqa: E402

TEXTS = [" ".join(pair) for pair in PHRASES] + [
    "The meeting moved to 10:45 on March 3rd, 2027, in room 118B.",
    "Call 555-0199 or email support@example.com before 5 p.m.",
    "It costs $1,299.99, about 15% more than last year's model.",
    "Photosynthesis converts carbon dioxide and water into glucose and oxygen.",
    "Sure! Here's a quick answer: yes, you can freeze cooked rice for up to a month.",
]
RATES_WPM = (165, 120)  # conversational, slow


def seconds(text: str, wpm: int) -> float:
    wav = subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(wpm), "-w", "/dev/stdout", text], capture_output=True)
    return (len(wav.stdout) - 44) / 2 / 22050  # (a 44-byte WAV header, 16-bit mono at 22,050 Hz)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = []
    for text in TEXTS:
        words = len(text.split())
        rates = {f"s_per_word_{w}wpm": seconds(text, w) / words for w in RATES_WPM}
        rows.append({"text": text, "words": words, **rates})
        print(f"{words:3d} words  " + "  ".join(f"{r:.3f}" for r in rates.values()) + f"  {text}")
    summary = {f"max_s_per_word_{w}wpm": max(r[f"s_per_word_{w}wpm"] for r in rows) for w in RATES_WPM}
    print(summary)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
