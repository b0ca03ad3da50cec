"""The realtime tests' reading of a session through the official SDK's connection."""

from __future__ import annotations

import asyncio


async def until(conn, last: str = "response.done", timeout: float = 120) -> list:
    """Server events up to and including the first of type ``last``."""
    events = []

    async def read():
        async for event in conn:
            events.append(event)
            if event.type == last:
                return

    await asyncio.wait_for(read(), timeout)
    return events
