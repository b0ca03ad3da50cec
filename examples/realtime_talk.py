"""Talk over the Realtime API: say something (a WAV file, or a text), hear the answer (saved as .wav).

python examples/realtime_talk.py --wav question.wav --out answer.wav
python examples/realtime_talk.py --text "Hello!"

The server: --base-url, else $OPENAI_BASE_URL (read as the openai SDK reads it), else
http://127.0.0.1:8000/v1; the key: $OPENAI_API_KEY, if the server asks for one.

With --wav, the audio streams in 100 ms chunks, as a microphone would, followed by a second of
silence: the server's VAD finds the end of the turn and answers by itself.
"""

import argparse
import asyncio
import base64
import os

import numpy as np
import openai
import soundfile
import soxr

parser = argparse.ArgumentParser()
parser.add_argument(
    "--base-url",
    default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
    help="the server's OpenAI API root (default: $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1)",
)
parser.add_argument("--wav", help="what to say (any WAV; converted to 24 kHz mono PCM16)")
parser.add_argument("--text", default="Tell me a short story.", help="what to say, without --wav")
parser.add_argument("--out", default="answer.wav")
args = parser.parse_args()


def pcm16_24k(path: str) -> bytes:
    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = soxr.resample(samples.mean(axis=1), rate, 24000)
    return (np.clip(mono, -1, 1) * 32767).astype("<i2").tobytes()


async def main() -> None:
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    async with client.realtime.connect(model="qwen3-omni") as conn:
        # the answer's length bound (max_audio_frames: 12.5 a second) is omniwalk's, as in chat's extra body
        session = {
            "type": "realtime",
            "audio": {"output": {"voice": "chelsie"}},
            "max_output_tokens": 32,
            "max_audio_frames": 50,
        }
        if args.wav:
            session["audio"]["input"] = {"transcription": {"model": "qwen3-omni"}}  # server VAD is on by default
        await conn.session.update(session=session)
        if args.wav:
            audio = pcm16_24k(args.wav) + bytes(2 * 24000)  # then a second of silence
            for i in range(0, len(audio), 4800):  # 100 ms chunks
                await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + 4800]).decode())
        else:
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": args.text}]}
            )
            await conn.response.create()
        pcm = []
        async for event in conn:
            if event.type == "conversation.item.input_audio_transcription.completed":
                print(f"\n(you said: {event.transcript})")
            elif event.type == "response.output_audio_transcript.delta":
                print(event.delta, end="", flush=True)
            elif event.type == "response.output_audio.delta":
                pcm.append(base64.b64decode(event.delta))  # 24 kHz mono int16
            elif event.type == "error":
                raise SystemExit(event.error.message)
            elif event.type == "response.done":
                break
    samples = np.frombuffer(b"".join(pcm), dtype="<i2")
    soundfile.write(args.out, samples, 24000)
    print(f"\nspeech: {args.out} ({len(samples) / 24000:.2f} s; usage {event.response.usage.total_tokens} tokens)")


asyncio.run(main())
