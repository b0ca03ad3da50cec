"""Sampling on the device, batched over requests with per-request parameters.

Order of operations on a step's raw logits [B, vocab] (HF's processor order, so greedy decoding
matches ``generate``): repetition penalty over each request's prompt + generated ids -> EOS
masked until ``min_tokens`` tokens exist, and ids a request's grammar forbids (``allowed``, a
bitmask) -> temperature (0 = greedy argmax) -> top-k -> top-p -> draw. Logprobs are reported from
the *raw* logits (log-softmax in fp32), i.e. the model's distribution, not the processed one.

The draw is Gumbel-max with noise from a counter-based hash of (request seed, token index,
vocabulary index), so a request's tokens depend only on its own seed and logits, never on which
other requests share the batch, and nothing is read back to the host to draw. ``sample`` ends
with the step's single host read (token ids, and logprobs when asked); ``sample_on_device``
keeps ids on the device for loops that feed them straight back (the code predictor).

``draw_reference`` is the PyTorch expression (the CPU path and the oracle); on CUDA ``draw``
runs the fused Triton kernels of ``kernels/sampling.py``, which give its ids (ties
included; the one documented exception is a top-p cut within rounding of ``top_p``).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from omniwalk.device import HostCopy, to_device
from omniwalk.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    repetition_penalty: float = 1.0
    seed: int | None = None  # None = a fresh random seed per request
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS / stop tokens are masked until this many tokens were generated
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        checks = [
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens must be in [0, max_tokens]"),
            (0 <= self.top_logprobs <= 20, "top_logprobs must be in [0, 20]"),
            (all(isinstance(s, str) and s for s in stop), "stop must be a non-empty string or a list of them"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)

    @classmethod
    def from_request(cls, request: dict) -> SamplingParams:
        """Pick the sampling fields out of a request dict (other keys are ignored; None = default)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in request.items() if k in names and v is not None})

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


class SamplerState:
    """One request's sampling state: parameters, stop ids, seed, and its seen-token mask."""

    def __init__(self, params: SamplingParams, eos_token_ids: tuple[int, ...], prompt_ids: list[int], grammar=None):
        self.params = params
        self.grammar = grammar  # a ``structured.matchers.GrammarState`` when the output must follow one
        eos = () if params.ignore_eos else eos_token_ids
        self.stop_ids = tuple(sorted({*eos, *params.stop_token_ids}))
        self.seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        self.prompt_ids = list(prompt_ids)
        self.seen: torch.Tensor | None = None  # [vocab] bool on the logits' device, made at first use
        self.num_generated = 0

    def is_stop_token(self, token_id: int) -> bool:
        """EOS (unless ``ignore_eos``) or one of ``stop_token_ids``."""
        return token_id in self.stop_ids

    def _seen(self, vocab: int, device) -> torch.Tensor:
        if self.seen is None:
            self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            if self.prompt_ids:
                self.seen[to_device(self.prompt_ids, device, torch.long)] = True
        return self.seen


@dataclass
class BatchParams:
    """A batch's sampling parameters as device tensors, one row per request.

    Optional fields are None when no row needs that operation (the eager path skips it); a CUDA
    graph has all of them, a missing one set to its neutral value (penalty 1, nothing banned,
    top-k = the vocabulary, top-p 1, not sampled), which leaves the result exactly unchanged.
    """

    temperature: torch.Tensor  # [B] fp32 (1 for greedy rows)
    penalty: torch.Tensor | None = None  # [B] fp32 repetition penalty
    seen: torch.Tensor | None = None  # [B, V] bool: prompt + generated ids (where the penalty applies)
    banned: torch.Tensor | None = None  # [B, V] bool: stop ids masked until min_tokens
    allowed: torch.Tensor | None = None  # [B, ceil(V / 32)] int32 bitmask: bit i % 32 of word i // 32 = id i allowed
    top_k: torch.Tensor | None = None  # [B] int64 (V = off)
    top_p: torch.Tensor | None = None  # [B] fp32 (1 = off)
    sampled: torch.Tensor | None = None  # [B] bool: draw (else greedy argmax)
    seeds: torch.Tensor | None = None  # [B] int64
    steps: torch.Tensor | None = None  # [B] int64: each row's token index (the noise counter)

    @classmethod
    def of(cls, states: list[SamplerState], vocab: int, device) -> BatchParams:
        """Build on the host from the requests' states."""
        params = [s.params for s in states]
        greedy = [p.is_greedy for p in params]
        out = cls(to_device([p.temperature or 1.0 for p in params], device, torch.float32))
        if any(p.repetition_penalty != 1.0 for p in params):
            out.penalty = to_device([p.repetition_penalty for p in params], device, torch.float32)
            out.seen = torch.stack([s._seen(vocab, device) for s in states])
        banned = [(row, i) for row, s in enumerate(states) if s.num_generated < s.params.min_tokens for i in s.stop_ids]
        if banned:
            out.banned = torch.zeros(len(states), vocab, dtype=torch.bool, device=device)
            flat = to_device([r * vocab + i for r, i in banned], device, torch.long)
            out.banned.view(-1).index_fill_(0, flat, True)  # (a scalar index_put would synchronise)
        top_k = [p.top_k if p.top_k and not g else vocab for p, g in zip(params, greedy, strict=True)]
        top_p = [p.top_p if not g else 1.0 for p, g in zip(params, greedy, strict=True)]
        if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            out.top_k, out.top_p = to_device(top_k, device, torch.long), to_device(top_p, device, torch.float32)
        if not all(greedy):
            out.sampled = to_device([not g for g in greedy], device, torch.bool)
            out.seeds = to_device([s.seed for s in states], device, torch.long)
            out.steps = to_device([s.num_generated for s in states], device, torch.long)
        return out

    def with_all_fields(self, vocab: int) -> BatchParams:
        """Every field of ``GRAPH_FIELDS`` present, absent ones at their neutral values (a CUDA graph's
        inputs); ``allowed`` stays as it is (grammar bitmasks are drawn outside graphs)."""
        rows, device = self.temperature.shape[0], self.temperature.device
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, (value, dtype, width) in _NEUTRAL.items():
            if out[name] is None:
                shape = (rows, width(vocab)) if width else (rows,)
                out[name] = torch.full(shape, vocab if value is None else value, dtype=dtype, device=device)
        return BatchParams(**out)


# the fields a CUDA graph's draws take as inputs: all but the grammar bitmask (a constrained draw runs eagerly,
# after the step before is committed: ``engine/inflight.py``)
GRAPH_FIELDS = tuple(f.name for f in fields(BatchParams) if f.name != "allowed")


def bitmask_width(vocab: int) -> int:
    """int32 words of a row's ``allowed`` bitmask."""
    return -(-vocab // 32)


_PER_ID, _SCALAR = (lambda vocab: vocab), None
# optional graph fields: (neutral value (None: the vocabulary size), dtype, row width (None: one per row))
_NEUTRAL = {
    "penalty": (1.0, torch.float32, _SCALAR),
    "seen": (False, torch.bool, _PER_ID),
    "banned": (False, torch.bool, _PER_ID),
    "top_k": (None, torch.long, _SCALAR),
    "top_p": (1.0, torch.float32, _SCALAR),
    "sampled": (False, torch.bool, _SCALAR),
    "seeds": (0, torch.long, _SCALAR),
    "steps": (0, torch.long, _SCALAR),
}


def process(logits: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
    """Raw logits [B, V] -> the fp32 scores each row is drawn from (-inf = excluded)."""
    return process_tensors(logits, BatchParams.of(states, logits.shape[1], logits.device))


def process_tensors(logits: torch.Tensor, p: BatchParams) -> torch.Tensor:
    scores = logits.float()
    if p.penalty is not None:
        penalty = p.penalty[:, None]
        scores = torch.where(p.seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)
    if p.banned is not None:
        scores = scores.masked_fill(p.banned, -float("inf"))
    if p.allowed is not None:
        scores = scores.masked_fill(~unpack_bitmask(p.allowed, scores.shape[1]), -float("inf"))
    scores = scores / p.temperature[:, None]  # greedy rows divide by 1: their argmax is unchanged
    if p.top_k is not None:
        scores = _top_k_top_p(scores, p.top_k, p.top_p)
    return scores


def unpack_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, ceil(V / 32)] int32 bitmask -> [B, V] bool."""
    ids = torch.arange(vocab, device=words.device)
    return ((words[:, ids >> 5] >> (ids & 31)) & 1).bool()


def _top_k_top_p(scores: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row: keep the ``top_k`` best, then the smallest best set reaching ``top_p`` (1 = all).
    Equal scores rank by index (a stable sort), which defines ties for the fused kernels too."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    ranks = torch.arange(scores.shape[1], device=scores.device)[None, :]
    sorted_scores = sorted_scores.masked_fill(ranks >= top_k[:, None], -float("inf"))
    probs = torch.softmax(sorted_scores, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the better tokens
    drop = (before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    drop[:, 0] = False
    return scores.scatter(1, order, sorted_scores.masked_fill(drop, -float("inf")))


# splitmix64 constants as signed int64 (torch integer arithmetic wraps modulo 2^64)
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15 - 2**64, 0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64


def _shr(z: torch.Tensor, n: int) -> torch.Tensor:
    return (z >> n) & ((1 << (64 - n)) - 1)  # logical shift of int64


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] Gumbel(0, 1) noise, a pure function of (seed, step, vocabulary index) per row."""
    key = _mix(seeds * _GOLDEN + steps)
    z = _mix(key[:, None] + (torch.arange(vocab, device=seeds.device)[None, :] + 1) * _GOLDEN)
    # 23 random bits -> u in (0, 1), every (bits + 0.5) exact in fp32. NOTE: with 24 bits the top
    # value rounds to u = 1, noise +inf, and a -inf (banned, filtered) score + inf = NaN, which
    # argmax takes: an excluded id drawn once per ~2^24 / V draws.
    return _gumbel_of_bits(_shr(z, 41))


def _gumbel_of_bits(bits: torch.Tensor) -> torch.Tensor:
    u = (bits.float() + 0.5) / 2**23
    return -torch.log(-torch.log(u))


def draw(logits: torch.Tensor, p: BatchParams, step_offset: int = 0) -> torch.Tensor:
    """Raw logits [B, V] -> one id per row [B] (int64 on the device); pure tensor work (graphable).
    ``step_offset`` is added to every row's token index (a loop that draws several tokens).
    On CUDA: the fused kernels (V <= 4096: one launch; larger: two, plus the PyTorch top-k/top-p
    between a processing launch and the draw when a row asks for them)."""
    if logits.is_cuda and _has_triton():
        return draw_fused(logits, p, step_offset)
    return draw_reference(logits, p, step_offset)


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def draw_fused(logits: torch.Tensor, p: BatchParams, step_offset: int = 0) -> torch.Tensor:
    """``draw`` through the fused kernels (CUDA; the tests also run it in Triton's CPU interpreter)."""
    from omniwalk.kernels import sampling as sampling_kernels

    if logits.shape[1] > sampling_kernels.SMALL_VOCAB_MAX and p.top_k is not None:
        scores = _top_k_top_p(sampling_kernels.process(logits, p), p.top_k, p.top_p)
        return sampling_kernels.draw(scores, p, step_offset, processed=True)
    return sampling_kernels.draw(logits, p, step_offset)


def draw_reference(logits: torch.Tensor, p: BatchParams, step_offset: int = 0) -> torch.Tensor:
    """``draw`` as a PyTorch expression: the CPU path and the fused kernels' oracle."""
    scores = process_tensors(logits, p)
    ids = scores.argmax(-1)
    if p.sampled is None:
        return ids
    drawn = (scores + gumbel_noise(p.seeds, p.steps + step_offset, scores.shape[1])).argmax(-1)
    return torch.where(p.sampled, drawn, ids)


def advance(states: list[SamplerState], ids: torch.Tensor | None, num_drawn: int = 1) -> None:
    """After a draw of ``ids`` [B] (None: not tracked): mark them seen, count ``num_drawn`` tokens per state."""
    for row, s in enumerate(states):
        if s.seen is not None and ids is not None:  # made by the first draw that needed it (a penalty != 1)
            s.seen.index_fill_(0, ids[row : row + 1], True)
        s.num_generated += num_drawn


def sample_on_device(
    logits: torch.Tensor, states: list[SamplerState], allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw one token per row [B] (int64, on the logits' device) and advance each state. ``allowed``:
    the rows' grammar bitmasks (``BatchParams.allowed``), or None."""
    params = BatchParams.of(states, logits.shape[1], logits.device)
    params.allowed = allowed
    ids = draw(logits, params)
    advance(states, ids)
    return ids


def sample(logits: torch.Tensor, states: list[SamplerState]) -> list[TokenLogprob]:
    """Draw one token per row and read ids (+ logprobs where asked) back in one transfer."""
    return sample_async(logits, states)()


def sample_async(
    logits: torch.Tensor, states: list[SamplerState], allowed: torch.Tensor | None = None
) -> Callable[[], list[TokenLogprob]]:
    """``sample`` in two halves: draw and queue the copy to the host now; the returned function
    waits for the copy and builds the picks (so other work can be launched in between)."""
    ids = sample_on_device(logits, states, allowed)
    columns = [ids[:, None].double()]
    k = max((s.params.top_logprobs for s in states if s.params.logprobs), default=0)
    want = any(s.params.logprobs for s in states)
    if want:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        columns.append(logprobs.gather(1, ids[:, None]).double())
        if k:
            values, top = torch.topk(logprobs, k, dim=-1)
            columns += [top.double(), values.double()]
    copy = HostCopy(torch.cat(columns, dim=1))

    def picks() -> list[TokenLogprob]:
        return _picks(states, copy.get().tolist(), k)  # NOTE: the step's one host read

    picks.ids = ids  # the drawn ids [B], still on the device: the next step's inputs, before the read
    return picks


def _picks(states: list[SamplerState], rows: list[list[float]], k: int) -> list[TokenLogprob]:
    out = []
    for s, row in zip(states, rows, strict=True):
        token = int(row[0])
        if not s.params.logprobs:
            out.append(TokenLogprob(token, 0.0))
            continue
        n = s.params.top_logprobs
        top = [(int(t), v) for t, v in zip(row[2 : 2 + n], row[2 + k : 2 + k + n], strict=True)]
        out.append(TokenLogprob(token, row[1], top))
    return out
