"""Text chat with the official OpenAI client.

python examples/chat.py --base-url http://127.0.0.1:8000/v1
"""

import argparse

import openai

parser = argparse.ArgumentParser()
parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
args = parser.parse_args()

client = openai.OpenAI(base_url=args.base_url, api_key="unused")
reply = client.chat.completions.create(
    model="qwen3-omni",
    messages=[{"role": "user", "content": "Say hello in one sentence."}],
    max_tokens=32,
)
print(reply.choices[0].message.content)
print(reply.usage)
