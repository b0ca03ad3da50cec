"""Streaming text + speech: print text deltas as they arrive, collect PCM16 chunks into a .wav.

python examples/stream_speech.py --out stream.wav

The server: --base-url, else $OPENAI_BASE_URL (read as the openai SDK reads it), else
http://127.0.0.1:8000/v1; the key: $OPENAI_API_KEY, if the server asks for one.
"""

import argparse
import base64
import os

import numpy as np
import openai
import soundfile

parser = argparse.ArgumentParser()
parser.add_argument(
    "--base-url",
    default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
    help="the server's OpenAI API root (default: $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1)",
)
parser.add_argument("--out", default="stream.wav")
args = parser.parse_args()

client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
stream = client.chat.completions.create(
    model="qwen3-omni",
    modalities=["text", "audio"],
    audio={"voice": "chelsie", "format": "pcm16"},
    messages=[{"role": "user", "content": "Tell me a short story."}],
    max_tokens=32,
    stream=True,
    extra_body={"max_audio_frames": 50},
)
pcm = []
for chunk in stream:
    for choice in chunk.choices:
        audio = getattr(choice.delta, "audio", None)  # with speech out the text is the audio's transcript
        if getattr(audio, "transcript", None):
            print(audio.transcript, end="", flush=True)
        if getattr(audio, "data", None):
            pcm.append(base64.b64decode(audio.data))  # 24 kHz mono int16
samples = np.frombuffer(b"".join(pcm), dtype="<i2")
soundfile.write(args.out, samples, 24000)
print(f"\nspeech: {args.out} ({len(samples) / 24000:.2f} s in {len(pcm)} chunks)")
