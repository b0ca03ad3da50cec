"""Text chat with the official OpenAI client.

python examples/chat.py

The server: --base-url, else $OPENAI_BASE_URL (read as the openai SDK reads it), else
http://127.0.0.1:8000/v1; the key: $OPENAI_API_KEY, if the server asks for one.
"""

import argparse
import os

import openai

parser = argparse.ArgumentParser()
parser.add_argument(
    "--base-url",
    default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
    help="the server's OpenAI API root (default: $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1)",
)
args = parser.parse_args()

client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
reply = client.chat.completions.create(
    model="qwen3-omni",
    messages=[{"role": "user", "content": "Say hello in one sentence."}],
    max_tokens=32,
)
print(reply.choices[0].message.content)
print(reply.usage)
