"""Hostile and unsupported request bodies with the answer each must get (status, param, code), and a
process's resident memory."""

USER = [{"role": "user", "content": "hi"}]


SPEECH = {"modalities": ["text", "audio"], "max_audio_frames": 2, "talker_temperature": 0.0}


def _part(part: dict) -> dict:
    return {"messages": [{"role": "user", "content": [part]}]}


BAD = "invalid_value"


# (body, status, param, code); the list first, then unsupported OpenAI features
HOSTILE = [
    ({"messages": USER, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"messages": USER, "modalities": ["text", "audio"], "audio": {"voice": 5}}, 400, "audio.voice", "invalid_type"),
    ({"messages": USER, "stop": 5}, 400, "stop", "invalid_type"),
    ({"messages": USER, "modalities": [1, "text"]}, 400, "modalities[0]", "invalid_value"),
    ({"messages": USER, "stream_options": "yes"}, 400, "stream_options", "invalid_type"),
    ({"messages": USER, "audio": {"format": []}}, 400, "audio.format", "invalid_value"),
    (_part({"type": "audio", "audio": [[0.1, 0.2], [0.3]]}), 400, "messages[0].content[0]", "invalid_value"),
    ({"messages": USER, "seed": 2**64 - 1}, 400, "seed", "invalid_value"),
    ({"messages": USER, "seed": 10**30}, 400, "seed", "invalid_value"),
    (_part({"type": "image_url", "image_url": {"url": "/tmp/a\0.png"}}), 400, "messages[0].content[0].image_url", BAD),
    ({"messages": USER, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": 2**40}, 400, "max_tokens", "invalid_value"),
    ({"messages": USER, "tools": [{"type": "function"}]}, 400, "tools", "unsupported_parameter"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, 400, "response_format", "unsupported_parameter"),
    ({"messages": USER, "n": 2}, 400, "n", "unsupported_value"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "unsupported_parameter"),
    ({"messages": USER, "bogus": 1}, 400, "bogus", "unknown_parameter"),
    ({"messages": []}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0]", "invalid_value"),
    ({"messages": [{"role": "assistant", "audio": {"id": "audio_nope"}}]}, 400, "messages[0].audio.id", BAD),
    ([1, 2], 400, None, "invalid_type"),
]


RAW = [
    (b"[" * 100_000 + b"]" * 100_000, 400, None, "invalid_json"),  # nesting beyond the parser's bound
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None, "invalid_json"),
    (b"", 400, None, "invalid_json"),
]


def rss_mb(pid: int) -> float:
    line = next(line for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024
