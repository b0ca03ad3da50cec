"""Continuous batching for a component with a KV cache (a language model, a speech LM).

The policy, once per step: **keep what is running moving, then admit what fits.**

1. Running requests, oldest first, each get their ready tokens (a prefill chunk or one decode
   token) while the step's token budget lasts. If the pool is out of pages, the newest running
   request is preempted (pages freed, its tokens recomputed later) — never a crash or a
   deadlock: the oldest request can always progress.
2. Waiting requests are admitted in FIFO order (skipping those whose inputs are not ready yet,
   e.g. a speech LM waiting for its first text tokens) while budget, pages and
   ``max_running`` allow. A long prompt is cut into chunks of the remaining budget, so it never
   stalls running decodes. With ``prefix_cache``, an admitted request first takes the pages of
   its prompt's prefix that an earlier request computed (``KVProgram.prefix_keys``; see
   ``kv_pages``) and computes only the rest; its own prefix pages stay keyed when it lets go.

What a request's tokens *are* is the model's business: a ``KVProgram`` says how many tokens of a
request are ready (``num_ready``) and runs a packed batch of them (``run``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from omniwalk.engine.cuda_graphs import even_pieces
from omniwalk.engine.inflight import Deferred, InFlight
from omniwalk.engine.kv_pages import KVStorage, PageTable
from omniwalk.engine.paged_attention import PagedBatch, Segment
from omniwalk.engine.request import Chunk, EngineRequest, Status, Work
from omniwalk.errors import InvalidRequestError


@dataclass(frozen=True)
class KVStageConfig:
    max_batch_tokens: int = 512  # prefill chunk tokens + decode tokens per step
    max_running: int = 64  # requests holding KV pages at once
    decode_attention: str = "reference"  # the kernel of pure decode steps (a name of kernels/registry.DECODE_ATTENTION)
    prefill_attention: str = "reference"  # other steps: per request, or one packed varlen call (layers/attention.py)
    prefix_cache: bool = False  # reuse prefix pages across requests (where the program names them)


class KVProgram:
    """The model side of a KV stage: ``num_ready``, ``run`` and ``is_finished``; the rest have
    defaults a program overrides when it has CUDA graphs or something to undo."""

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        """Tokens of ``req`` that can run now, given ``num_cached`` are in its KV (0 = wait); for a
        waiting request, those its admission would take from keyed pages."""
        raise NotImplementedError

    def run(self, batch: list[Chunk], kv: PagedBatch) -> Callable[[], None] | Deferred | None:
        """Run each chunk's tokens (packed in batch order) and consume the outputs (sample where a
        request's ready tokens end).

        May return a function that finishes the work (waits for the host read of what was
        sampled and commits it). The stage calls it one step later, after launching the next
        step's batch (``engine/inflight.py``): so ``num_ready`` and the next ``run`` must count
        what was sampled but not read yet, and take it from the device; a commit that ends a
        request (a stop) drops what the next step already did for it. Must leave request state
        untouched if it raises: the stage then reruns requests alone. A ``Deferred`` instead holds back
        the part of the launch that needs the step before committed (``engine/inflight.py``).
        """
        raise NotImplementedError

    def is_finished(self, req: EngineRequest) -> bool:
        raise NotImplementedError

    def prefix_keys(self, req: EngineRequest, page_size: int) -> list[bytes]:
        """One key per full page of ``req``'s prompt whose keys/values another request may share:
        each names every token up to that page's end (whatever its keys and values depend on), and
        the pages end before the prompt's last token (which must run to draw). Default: none."""
        return []

    def on_add(self, req: EngineRequest) -> None:
        """The request joined the stage (before it is scheduled)."""

    def expect_prefix(self, req: EngineRequest, num_tokens: int) -> None:
        """On joining: keyed pages hold the first ``num_tokens`` of the request's prompt now. Its
        admission may take fewer (pages evicted meanwhile; ``num_ready`` is asked with what it would
        take); stages before this one may skip work only that prefix needs."""

    def on_prefix(self, req: EngineRequest, storage: KVStorage, slots: list[int]) -> None:
        """The request was admitted with its first ``len(slots)`` positions in keyed pages (at these
        storage slots): not computed for it."""

    def on_preempt(self, req: EngineRequest) -> None:
        """The request's KV was dropped; its tokens will be recomputed from position 0."""

    def on_remove(self, req: EngineRequest) -> None:
        """The request left the stage (finished, aborted or failed): let go of what ``on_add`` and
        ``num_ready`` took for it."""

    def capture_graphs(self, storage: KVStorage, pool=None):
        """Capture CUDA graphs over this stage's KV storage (at start-up); returns the memory pool."""
        return pool

    def graph_rows(self, batch: list[Chunk]) -> list[bool] | None:
        """Which chunks a captured graph can run (the stage runs them as batches of their own, of at most
        ``graph_batch()`` rows each); None: no graphs."""
        return None

    def graph_batch(self) -> int:
        """The most rows one replay of the captured graph runs (0: no bound)."""
        return 0

    def stats(self) -> dict:
        """Counters reported beside the stage's own (graph replays, eager steps)."""
        return {}


class KVStage:
    def __init__(self, name: str, program: KVProgram, storage: KVStorage, config: KVStageConfig, device):
        self.name, self.program, self.storage, self.config, self.device = name, program, storage, config, device
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.tables: dict[str, PageTable] = {}
        self.prefix: dict[str, list[bytes]] = {}  # request id -> its prefix keys (prefix_cache)
        self.num_preemptions = 0
        self.num_prefix_tokens = 0  # prompt tokens taken from keyed pages instead of computed
        self.last_batch_size = 0
        self.inflight = InFlight(name, device)  # (also where its work launches: its device)

    @property
    def pool(self):
        return self.storage.pool

    def add(self, req: EngineRequest) -> None:
        self.program.on_add(req)
        self.tables[req.id] = PageTable()
        if self.config.prefix_cache:
            self.prefix[req.id] = self.program.prefix_keys(req, self.pool.page_size)
            if self.prefix[req.id]:
                self.program.expect_prefix(req, self._keyed_tokens(req))
        self.waiting.append(req)

    def _keyed_tokens(self, req: EngineRequest) -> int:
        """The prompt tokens keyed pages hold now (what taking its prefix would give)."""
        return self.pool.count_prefix(self.prefix.get(req.id, ())) * self.pool.page_size

    def remove(self, req: EngineRequest) -> None:
        """Drop a request (finished, aborted or failed) and free its pages (its computed prefix
        pages stay keyed, unless it failed)."""
        table = self.tables.pop(req.id, None)
        keys = self.prefix.pop(req.id, [])
        if table is not None:
            table.release(self.pool, keys if req.status is not Status.FAILED else ())
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if table is not None:
            self.program.on_remove(req)

    def is_done(self, req: EngineRequest) -> bool:
        return req.id not in self.tables

    def schedule(self) -> list[Work]:
        batch, budget = [], self.config.max_batch_tokens
        for req in sorted(self.running, key=lambda r: r.order):
            if budget == 0:
                break
            if req not in self.running:  # preempted earlier in this loop
                continue
            n = min(self.program.num_ready(req, self.tables[req.id].num_cached), budget)
            if n and self._reserve(req, n):
                batch.append(Work(req, n))
                budget -= n
        for req in list(self.waiting):
            if budget == 0 or len(self.running) >= self.config.max_running:
                break
            table = self.tables[req.id]
            if self.program.num_ready(req, table.num_cached if table.pages else self._keyed_tokens(req)) == 0:
                continue  # inputs not ready yet; later requests may be
            if not table.pages and self.prefix.get(req.id):
                table.take_prefix(self.pool, self.prefix[req.id])
            n = min(self.program.num_ready(req, table.num_cached), budget)
            if not table.reserve(self.pool, n):
                needed = table.num_cached + n
                table.release(self.pool)  # (its prefix pages back, idle again)
                if not self.running:  # the pool holds no other request's pages: it never will fit
                    self._fail_oversized(req, needed)
                    continue
                break  # FIFO: nobody overtakes the head for pages
            self.num_prefix_tokens += table.num_cached
            if table.num_cached:
                self.program.on_prefix(req, self.storage, table.slots(self.pool, 0, table.num_cached))
            req.cached.setdefault(self.name, table.num_cached)  # (the first admission's: usage reports it)
            self.waiting.remove(req)
            self.running.append(req)
            req.status = Status.RUNNING
            batch.append(Work(req, n))
            budget -= n
        return batch

    def _reserve(self, req: EngineRequest, n: int) -> bool:
        """Pages for ``n`` more tokens of a running request, preempting newer requests if needed."""
        table = self.tables[req.id]
        while not table.reserve(self.pool, n):
            if self.running == [req]:  # alone, and still short: the pool cannot hold it
                self._fail_oversized(req, table.num_cached + n)
                return False
            victim = max(self.running, key=lambda r: r.order)
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _fail_oversized(self, req: EngineRequest, tokens: int) -> None:
        """Fail a request that needs more of this stage's KV at once than the whole pool holds (it
        would be preempted and readmitted forever); the others go on."""
        capacity = self.pool.num_pages * self.pool.page_size
        req.fail(
            InvalidRequestError(
                f"the request needs KV cache for {tokens} tokens in the {self.name}, more than its whole pool "
                f"holds ({capacity} tokens): shorten it (or its max_tokens), or raise the {self.name}'s KV bytes"
            )
        )
        self.remove(req)

    def _preempt(self, req: EngineRequest) -> None:
        self.tables[req.id].release(self.pool, self.prefix.get(req.id, ()))
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.program.on_preempt(req)
        self.num_preemptions += 1

    def step(self) -> bool:
        """Launch this step's batch on the stage's device (``finish`` completes the step before it);
        returns whether any work was launched."""
        self.inflight.begin_step()
        with self.inflight.launching():
            for req in [r for r in (*self.running, *self.waiting) if self._is_done(r)]:
                self.remove(req)  # finished without work in this stage (e.g. nothing left to say)
            batch = self.schedule()
            self.last_batch_size = len(batch)
            for group in self._groups(batch) if batch else []:
                self.inflight.launch(group, self._run, self.remove)
        return bool(batch)

    def finish(self) -> None:
        """Complete the previous step's batch (host reads and commits; all launched work when this
        step launched none), then drop finished requests."""
        with self.inflight.launching():
            self.inflight.complete(self.remove)
        for req in [r for r in (*self.running, *self.waiting) if self._is_done(r)]:
            self.remove(req)

    def _groups(self, batch: list[Work]) -> list[list[Work]]:
        """The step's forwards: one, or more when the program can replay a graph for some rows (pure
        decode) but not the others (prefill chunks): those rows first, as batches of their own, so
        arriving prompts never push running decodes off their graph; rows past the largest graph
        replay it in even pieces (e.g. 80 rows as two of 40) rather than running eagerly."""
        flags = self.program.graph_rows([Chunk(req, self.tables[req.id].num_cached, n) for req, n in batch])
        if flags is None or not any(flags):
            return [batch]
        graphed = [b for b, f in zip(batch, flags, strict=True) if f]
        rest = [b for b, f in zip(batch, flags, strict=True) if not f]
        return even_pieces(graphed, self.program.graph_batch()) + ([rest] if rest else [])

    def capture_graphs(self, pool=None):
        return self.program.capture_graphs(self.storage, pool)

    def stats(self) -> dict:
        return {
            "kv_pages_used": self.pool.num_used,
            "kv_pages_total": self.pool.num_pages,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "batch_size": self.last_batch_size,
            "preemptions": self.num_preemptions,
            "prefix_tokens": self.num_prefix_tokens,
            "kv_pages_keyed": self.pool.num_keyed,
            **self.program.stats(),
        }

    def _is_done(self, req: EngineRequest) -> bool:
        return req.status is Status.FAILED or self.program.is_finished(req)

    def _run(self, batch: list[Work]) -> Callable[[], None] | None:
        segments = [Segment(self.tables[r.id], n) for r, n in batch]
        starts = [seg.table.num_cached for seg in segments]
        cfg = self.config
        kv = PagedBatch(self.storage, segments, self.device, cfg.decode_attention, cfg.prefill_attention)
        try:
            return self.program.run([Chunk(r, start, n) for (r, n), start in zip(batch, starts, strict=True)], kv)
        except Exception:
            for seg, start in zip(segments, starts, strict=True):  # the model may have advanced them
                seg.table.num_cached = start
            raise
