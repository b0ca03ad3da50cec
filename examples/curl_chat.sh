#!/usr/bin/env bash
# Text chat and text-to-speech with curl.   bash examples/curl_chat.sh http://127.0.0.1:8000
# Without an argument: $OPENAI_BASE_URL less its /v1, else http://127.0.0.1:8000.
set -euo pipefail
API=${OPENAI_BASE_URL:-http://127.0.0.1:8000/v1}
BASE=${1:-${API%/v1}}
curl -sf "$BASE/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "qwen3-omni", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}'
echo
curl -sf "$BASE/v1/audio/speech" -H 'content-type: application/json' \
  -d '{"model": "qwen3-omni", "input": "good morning", "voice": "aiden", "response_format": "wav", "max_audio_frames": 25}' \
  -o speech.wav
echo "speech.wav: $(wc -c < speech.wav) bytes"
