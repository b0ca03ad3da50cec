"""The HTTP process's media pool: media bytes -> arrays, beside the event loop and the engine.

A media part's bytes come from base64, a ``data:`` URL, an allowed local path (read in a worker)
or an allowed remote URL (fetched on the event loop, asynchronously: a slow URL delays only its
own request). Decoding and preprocessing (``omniwalk.media.preprocess``: images and video resized
as the served family's processor resizes them, ``ModelInfo.patch_specs``) run in a bounded pool
of threads; the engine then receives arrays only, and its step loop never decodes.

Threads, not processes: the codecs and resizers release the GIL, so threads decode a mixed set
about as fast as as many processes while the event loop stays responsive, and processes would
also pay a copy of every decoded array back to this process.

Bounds: ``media_workers`` threads; at most ``max_media_queue`` items submitted and not done. The
next item is refused with a 429, or, given ``max_wait_s`` (a realtime session's audio: its turn
would otherwise end in an error), waits that long for a place first: waiters are served in order,
each place handed by the item leaving it to the first waiter, so a new item never takes it from
them. Bad media fails only its request: a 400 naming the content part. Each item's decoded size
is admitted from its header against its kind's budget and its request's (``omniwalk.media.budget``),
so the pool's media memory is at most ``max_media_queue x max_{kind}_decoded_bytes`` of arrays
being made (plus their encoded bytes; a waiting item's are its request's).

Cancellation: a request's items share a ``DecodeTicket``; when the request ends early (its client
hung up, another of its items was refused, its task was cancelled), the ticket is cancelled: an
item not started yet is dropped, a running one stops at its next frame or chunk. Either is
counted in ``omniwalk_media_cancelled_total{kind}``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from omniwalk.errors import InvalidRequestError
from omniwalk.media.budget import DecodeTicket
from omniwalk.media.errors import DecodeCancelled
from omniwalk.media.fetch import fetch_remote, is_remote, read_local
from omniwalk.media.limits import MediaLimits
from omniwalk.media.patch_spec import PatchSpec
from omniwalk.media.payload import b64decode
from omniwalk.media.preprocess import preprocess
from omniwalk.serve.errors import APIError, bad_request
from omniwalk.serve.metrics import Metrics

log = logging.getLogger("omniwalk.media")


class MediaPool:
    def __init__(self, limits: MediaLimits, workers: int, max_queued: int, metrics: Metrics):
        self.limits, self.max_queued, self.metrics = limits, max_queued, metrics
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="omniwalk-media")
        self.num_queued = 0  # submitted, not done (places taken, a place handed to a waiter included)
        self.waiters: collections.deque[asyncio.Future] = collections.deque()  # for a place, first come first

    async def decode(
        self,
        kind: str,
        source: str,
        where: str,
        *,
        is_base64: bool = False,
        spec: PatchSpec | None = None,
        ticket: DecodeTicket | None = None,
        max_wait_s: float = 0.0,
    ) -> dict:
        """One content part -> its array part (``preprocess``, resizing by ``spec``). ``source`` is
        base64 data (``is_base64``) or a URL / path; ``where`` names the part in error messages;
        ``ticket`` is its request's (budget and cancel flag); ``max_wait_s``: how long a full queue
        is waited for before the 429."""
        await self._take_place(max_wait_s)
        self.metrics.media_queue.inc()
        try:
            payload = await fetch_remote(source, where, self.limits) if is_remote(source) else None
            work = self.executor.submit(self._work, kind, source, payload, where, is_base64, spec, ticket)
            try:
                return await asyncio.wrap_future(work)
            except asyncio.CancelledError:
                if work.cancel():  # not started: dropped (a running one stops itself at its ticket)
                    self.metrics.media_cancelled.labels(kind).inc()
                raise
        except InvalidRequestError as e:  # media errors included
            message = str(e) if str(e).startswith(where) else f"{where}: {e}"
            raise bad_request(message, param=where) from None
        finally:
            self.metrics.media_queue.dec()
            self._leave_place()

    async def _take_place(self, max_wait_s: float) -> None:
        """A place in the queue, waiting up to ``max_wait_s`` for one when it is full; else the 429."""
        if self.num_queued < self.max_queued:
            self.num_queued += 1
            return
        if max_wait_s > 0:
            place = asyncio.get_running_loop().create_future()
            self.waiters.append(place)
            is_placed = False
            try:
                async with asyncio.timeout(max_wait_s):
                    await place
                is_placed = True  # (handed over by the item that left it: counted already)
            except TimeoutError:
                pass
            finally:
                if not is_placed:  # (the wait ran out, or its task was cancelled)
                    self._withdraw(place)
            if is_placed:
                return
        message = "the media decoding queue is full; retry shortly"
        raise APIError(429, message, code="media_queue_full", headers={"Retry-After": "1"})

    def _leave_place(self) -> None:
        """An item is done: its place goes to the first waiter, else back to the queue."""
        while self.waiters:
            place = self.waiters.popleft()
            if not place.done():  # (one whose wait ended is skipped)
                place.set_result(None)
                return
        self.num_queued -= 1

    def _withdraw(self, place: asyncio.Future) -> None:
        """A waiter gives up: a place handed to it as its wait ended is passed on."""
        if place.done() and not place.cancelled():
            self._leave_place()
        elif place in self.waiters:
            self.waiters.remove(place)

    def _work(self, kind: str, source: str, payload: bytes | None, where: str, is_base64: bool, spec, ticket) -> dict:
        """In a worker thread: the bytes, then the arrays."""
        start = time.perf_counter()
        try:
            if ticket is not None:
                ticket.check()
            if payload is None:
                payload = b64decode(source, where) if is_base64 else self._inline_or_local(source, where)
            part = preprocess(kind, payload, self.limits, spec, ticket)
        except DecodeCancelled:
            self.metrics.media_cancelled.labels(kind).inc()
            log.info(
                "%s: %s decoding stopped after %.3f s: its request ended", where, kind, time.perf_counter() - start
            )
            raise
        self.metrics.media_seconds.labels(kind).observe(time.perf_counter() - start)
        return part

    def _inline_or_local(self, url: str, where: str) -> bytes:
        if url.startswith("data:"):
            header, _, data = url.partition(",")
            if not header.endswith(";base64"):
                raise InvalidRequestError(f"{where}: data: URLs must carry base64 content")
            return b64decode(data, where)
        return read_local(url, where, self.limits)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
