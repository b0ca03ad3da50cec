"""The grammar engine beside the sampler: a matcher per constrained request, and each step's bitmask.

``Grammars`` (one per thinker) holds the tokenizer as llguidance sees it (built on first use), the
compiled grammars keyed by their content (a template matcher each; a request takes a copy) and the
threads that compile them, so a compile never runs on the engine loop (llguidance drops the GIL
while it compiles, and ``grammars.LIMITS`` bounds its work). A request waits (its stage's
``num_ready`` says 0) until its grammar is compiled; a grammar that fails, or takes longer than
``timeout_s``, fails that request alone.

Per step: ``bitmask`` writes the next-token bitmask of every row (all bits set for a row without a
grammar or whose request has ended) from each matcher's state, which holds every token committed
so far; ``GrammarState.accept`` advances a matcher by a committed token.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llguidance
import llguidance.numpy
import numpy as np

from omniwalk.errors import InvalidRequestError
from omniwalk.sampling import bitmask_width
from omniwalk.structured.grammars import LIMITS, Constraint


class GrammarState:
    """One request's matcher: ready once its grammar is compiled (``take`` raises a compile error)."""

    def __init__(self, grammars: Grammars, template: Future):
        self.grammars, self._template = grammars, template
        self.timeout_s = grammars.timeout_s
        self._deadline = time.monotonic() + self.timeout_s
        self.matcher: llguidance.LLMatcher | None = None

    def is_ready(self) -> bool:
        """Whether the grammar is compiled (or failed); raises once the compile is past its time."""
        if self.matcher is not None or self._template.done():
            return True
        if time.monotonic() > self._deadline:
            raise InvalidRequestError(f"the output's grammar took longer than {self.timeout_s:g} s to compile")
        return False

    def take(self) -> None:
        """Copy the compiled template (the request's own matcher); raises the compile's error."""
        if self.matcher is None:
            self.matcher = self._template.result().deep_copy()

    def accept(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"token {token_id} breaks the output's grammar: {self.matcher.get_error()}")

    @property
    def is_live(self) -> bool:
        """Constraining: taken and not failed (past the grammar's end it allows only the end of the output)."""
        return self.matcher is not None and not self.matcher.is_error()


class Grammars:
    def __init__(
        self,
        tokenizer_json: Path,
        vocab: int,
        eos_ids: tuple[int, ...],
        cache_size: int = 256,
        threads: int = 2,
        timeout_s: float = 10.0,
        synchronous: bool = False,
    ):
        """``tokenizer_json``: the checkpoint's tokenizer.json (read at the first compile); ``vocab``: the
        logits' width (ids the tokenizer lacks are never allowed); ``eos_ids``: what ends an output whose
        grammar is complete.
        ``synchronous``: compile within ``start`` (tensor-parallel ranks must all see a grammar ready at
        the same step, which background compiles finishing at their own pace would not give)."""
        self.vocab, self.eos_ids, self.cache_size, self.timeout_s = vocab, list(eos_ids), cache_size, timeout_s
        self.synchronous = synchronous
        self._tokenizer_json = tokenizer_json
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, Future] = OrderedDict()  # grammar -> its template matcher
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="omniwalk-grammar")

    def start(self, constraint: Constraint) -> GrammarState:
        """A new request's matcher state; its grammar compiles in the background unless cached."""
        with self._lock:
            future = self._compiled.pop(constraint.grammar, None)
            if future is None:
                future = self._pool.submit(self._compile, constraint)
            self._compiled[constraint.grammar] = future  # (most recently used last)
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        if self.synchronous:
            future.exception()  # (waits; a failure is raised where the request takes its matcher)
        return GrammarState(self, future)

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        with self._lock:
            if self._tokenizer is None:
                text = self._tokenizer_json.read_text()
                tokenizer = llguidance.LLTokenizer(text, n_vocab=self.vocab, eos_token=self.eos_ids)
                self._tokenizer = tokenizer
        matcher = llguidance.LLMatcher(self._tokenizer, constraint.grammar, limits=LIMITS, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{constraint.param}: {matcher.get_error()}", constraint.param)
        return matcher


def bitmask(states: list[GrammarState | None]) -> np.ndarray:
    """Each row's next-token bitmask [len(states), ceil(vocab / 32)] int32 (at least one state given);
    rows without a live grammar allow every id.

    The rows are filled one after another on the calling thread: inside the engine that is ~3x faster
    at B = 32 than the grammar engine's parallel fill, whose worker threads compete with the engine's
    (benchmarks/structured/constrained_steps.py ``--fill``; docs/performance.md)."""
    grammars = next(g for g in states if g is not None).grammars
    mask = np.full((len(states), bitmask_width(grammars.vocab)), -1, dtype=np.int32)
    for row, g in enumerate(states):
        if g is not None and g.is_live:
            llguidance.numpy.fill_next_token_bitmask(g.matcher, mask, row)
    return mask
