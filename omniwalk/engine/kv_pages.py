"""Paged KV storage: a fixed pool of pages per KV model, page tables per request.

Vocabulary (per request, in tokens):
    num_cached   tokens whose keys/values are stored in its pages
    num_new      tokens the current step appends (prefill chunk or one decode token)
    capacity     len(pages) * page_size; always >= num_cached + num_new during a step

A token at absolute position p of a request lives in slot ``pages[p // page_size] * page_size +
p % page_size`` of the flattened [num_pages * page_size, kv_heads, head_dim] storage.

Prefix pages: a full page of a prompt's prefix can outlive its request, kept under a key that
names every token up to its end (``KVProgram.prefix_keys``: a chain of digests). A later request
whose prefix has the same keys starts with those pages in its table (``PageTable.take_prefix``)
instead of computing them; nobody writes a page while it is keyed (a request only writes past its
``num_cached``). A keyed page no table holds is idle: free to hand out again, least recently used
first, and then forgotten. ``num_free`` counts idle pages as free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from omniwalk.kernels.tuned import DECODE_PROGRAMS


class PagePool:
    """Free-list allocator over ``num_pages`` pages of ``page_size`` tokens, with keyed prefix pages
    (see the module docstring)."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages, self.page_size = num_pages, page_size
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._page_of: dict[bytes, int] = {}  # keyed pages: key -> page
        self._key_of: dict[int, bytes] = {}  # page -> key
        self._holders: dict[int, int] = {}  # keyed pages: tables holding each
        self._idle: OrderedDict[int, None] = OrderedDict()  # keyed pages no table holds, oldest first

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._idle)

    @property
    def num_used(self) -> int:
        return self.num_pages - self.num_free

    @property
    def num_keyed(self) -> int:
        return len(self._key_of)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.num_free

    def allocate(self, num_pages: int) -> list[int]:
        """Free pages first, then idle keyed ones (least recently used first; their keys forgotten)."""
        if num_pages > self.num_free:
            raise MemoryError(f"KV pool exhausted: {num_pages} pages wanted, {self.num_free} free")
        pages = [self._free.pop() for _ in range(min(num_pages, len(self._free)))]
        while len(pages) < num_pages:
            page, _ = self._idle.popitem(last=False)
            del self._page_of[self._key_of.pop(page)], self._holders[page]
            pages.append(page)
        return pages

    def free(self, pages: list[int]) -> None:
        """A table lets go of its pages: keyed ones go idle when their last holder lets go."""
        for page in reversed(pages):
            if page not in self._key_of:
                self._free.append(page)
                continue
            self._holders[page] -= 1
            if self._holders[page] == 0:
                self._idle[page] = None

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        """How many pages ``take(keys)`` would hold now (nothing taken)."""
        n = 0
        while n < len(keys) and keys[n] in self._page_of:
            n += 1
        return n

    def take(self, keys: Sequence[bytes]) -> list[int]:
        """The keyed pages of the longest run of ``keys`` from the first, each now held once more."""
        pages = []
        for key in keys:
            page = self._page_of.get(key)
            if page is None:
                break
            pages.append(page)
            self._holders[page] += 1
            self._idle.pop(page, None)
        return pages

    def keep(self, key: bytes, page: int) -> None:
        """Key a page its (one) holding table computed; nothing if the key or the page has one already."""
        if key in self._page_of or page in self._key_of:
            return
        self._page_of[key], self._key_of[page], self._holders[page] = page, key, 1


@dataclass
class PageTable:
    """One request's pages in one KV model."""

    pages: list[int] = field(default_factory=list)
    num_cached: int = 0

    def pages_needed(self, pool: PagePool, num_new: int) -> int:
        return max(0, pool.pages_for(self.num_cached + num_new) - len(self.pages))

    def reserve(self, pool: PagePool, num_new: int) -> bool:
        """Grow to hold ``num_new`` more tokens; False (and nothing taken) if the pool is short."""
        needed = self.pages_needed(pool, num_new)
        if not pool.can_allocate(needed):
            return False
        self.pages.extend(pool.allocate(needed))
        return True

    def take_prefix(self, pool: PagePool, keys: Sequence[bytes]) -> None:
        """An empty table starts with the keyed pages of its prefix (``keys``, one per full page)."""
        assert not self.pages, "a table takes its prefix before any page"
        self.pages = pool.take(keys)
        self.num_cached = len(self.pages) * pool.page_size

    def release(self, pool: PagePool, keys: Sequence[bytes] = ()) -> None:
        """Let go of every page, keying first those of ``keys`` whose tokens it holds (computed)."""
        for key, page in zip(keys[: self.num_cached // pool.page_size], self.pages, strict=False):
            pool.keep(key, page)
        pool.free(self.pages)
        self.pages, self.num_cached = [], 0

    def slots(self, pool: PagePool, start: int, end: int) -> list[int]:
        """Flat storage slots of absolute positions [start, end)."""
        size = pool.page_size
        return [self.pages[p // size] * size + p % size for p in range(start, end)]


class KVStorage:
    """Key and value pages of every layer of one model: [(num_pages + 1) * page_size, kv_heads, head_dim].

    The extra last page belongs to no request: padding rows of a fixed-size (CUDA graph) batch
    write their keys to its first slot, ``scratch_slot``. ``semaphores``: the paged decode kernel's
    counters for rows split over programs (zero between calls; this model's layers run one at a time).
    ``rows`` (``row_width`` > 0, else None): a row of that many values per slot that lives and is shared
    with its page, for what a program keeps of a position beside its keys (the thinker: what its talker
    reads of a prompt position, so that a request taking keyed pages finds it there).
    """

    def __init__(
        self, pool: PagePool, num_layers: int, num_kv_heads: int, head_dim: int, dtype, device, row_width: int = 0
    ):
        shape = ((pool.num_pages + 1) * pool.page_size, num_kv_heads, head_dim)
        self.pool = pool
        self.scratch_slot = pool.num_pages * pool.page_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.rows = torch.zeros((shape[0], row_width), dtype=dtype, device=device) if row_width else None
        self.semaphores = torch.zeros(DECODE_PROGRAMS, dtype=torch.int32, device=device)

    @staticmethod
    def bytes_per_page(
        page_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype, row_width: int = 0
    ) -> int:
        values = 2 * num_layers * num_kv_heads * head_dim + row_width
        return values * page_size * torch.empty(0, dtype=dtype).element_size()

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype,
        device,
        row_width: int = 0,
    ) -> KVStorage:
        per_page = cls.bytes_per_page(page_size, num_layers, num_kv_heads, head_dim, dtype, row_width)
        num_pages = budget_bytes // per_page
        if num_pages < 1:
            raise ValueError(f"KV budget of {budget_bytes} bytes holds no page ({per_page} bytes each)")
        return cls(PagePool(num_pages, page_size), num_layers, num_kv_heads, head_dim, dtype, device, row_width)
