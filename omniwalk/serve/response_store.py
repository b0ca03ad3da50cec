"""Stored /v1/responses: what ``GET /v1/responses/{id}`` returns and ``previous_response_id`` continues.

A stored response keeps its body (the Response object) and its conversation as input items: those
of the response it continued, its own input items (never its ``instructions``, which OpenAI does not
carry over), then its output items. Bounded three ways: the
newest ``capacity`` responses, each until ``expiry_s`` after it was stored, and ``max_bytes`` of
stored JSON (media data URLs count as their text) — the oldest go first.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredResponse:
    body: dict  # the Response object as it was answered
    items: list[dict]  # the conversation up to and including this response's output (Responses items)
    expires_at: float  # unix seconds
    num_bytes: int  # what it counts against the store's byte bound


class ResponseStore:
    def __init__(self, capacity: int, expiry_s: int, max_bytes: int):
        self.capacity, self.expiry_s, self.max_bytes = capacity, expiry_s, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0

    def put(self, body: dict, items: list[dict]) -> None:
        """Keep ``body`` (under its id) with its conversation; older ones make room."""
        num_bytes = len(json.dumps(body)) + len(json.dumps(items))
        self.delete(body["id"])
        self._entries[body["id"]] = StoredResponse(body, items, time.time() + self.expiry_s, num_bytes)
        self.num_bytes += num_bytes
        while self._entries and (len(self._entries) > self.capacity or self.num_bytes > self.max_bytes):
            self.delete(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None and entry.expires_at < time.time():
            self.delete(response_id)
            return None
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not stored."""
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.num_bytes -= entry.num_bytes
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)
