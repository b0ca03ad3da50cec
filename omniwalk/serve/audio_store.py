"""Assistant audio that a later request may reference by id (``{"role": "assistant", "audio": {"id"}}``).

OpenAI keeps a response's audio for a while so a conversation can continue from it. Here the
model reads an assistant turn as text, so only the transcript is kept: the newest ``capacity``
answers, each until its ``expires_at``. Unknown or expired ids are the caller's error (400).
"""

from __future__ import annotations

import time
from collections import OrderedDict


class AudioStore:
    def __init__(self, capacity: int, expiry_s: int):
        self.capacity, self.expiry_s = capacity, expiry_s
        self._entries: OrderedDict[str, tuple[str, int]] = OrderedDict()  # id -> (transcript, expires_at)

    def put(self, audio_id: str, transcript: str) -> int:
        """Keep ``transcript`` under ``audio_id``; returns its expires_at (unix seconds)."""
        expires_at = int(time.time()) + self.expiry_s
        self._entries[audio_id] = (transcript, expires_at)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return expires_at

    def get(self, audio_id: str) -> str | None:
        entry = self._entries.get(audio_id)
        if entry is None or entry[1] < time.time():
            self._entries.pop(audio_id, None)
            return None
        return entry[0]

    def __len__(self) -> int:
        return len(self._entries)
