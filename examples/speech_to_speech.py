"""Audio in, text + speech out, saved as a .wav (the OpenAI audio chat API).

    python examples/speech_to_speech.py --audio question.wav --out answer.wav

The server: --base-url, else $OPENAI_BASE_URL (read as the openai SDK reads it), else
http://127.0.0.1:8000/v1; the key: $OPENAI_API_KEY, if the server asks for one.

Without --audio it sends a generated one-second tone.
"""

import argparse
import base64
import io
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
parser.add_argument("--audio", help="a wav/flac/mp3/ogg file to ask about")
parser.add_argument("--out", default="answer.wav")
args = parser.parse_args()

if args.audio:
    data = open(args.audio, "rb").read()
else:
    buf = io.BytesIO()
    soundfile.write(buf, 0.2 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000), 16000, format="WAV")
    data = buf.getvalue()

client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
reply = client.chat.completions.create(
    model="qwen3-omni",
    modalities=["text", "audio"],
    audio={"voice": "ethan", "format": "wav"},
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}},
                {"type": "text", "text": "What do you hear?"},
            ],
        }
    ],
    max_tokens=32,
    extra_body={"max_audio_frames": 50},  # at most 4 s of speech
)
message = reply.choices[0].message
open(args.out, "wb").write(base64.b64decode(message.audio.data))
print(f"text: {message.audio.transcript!r}")  # with speech out, the text is the audio's transcript
print(f"speech: {args.out} ({soundfile.info(args.out).duration:.2f} s)")
