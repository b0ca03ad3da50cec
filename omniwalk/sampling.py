"""Sampling parameters and the reference sampler (one request, CPU or GPU, the test oracle).

Order of operations on a step's raw logits [vocab] (HF's processor order, so greedy decoding
matches ``generate``): repetition penalty over prompt + generated ids -> EOS masked until
``min_tokens`` tokens exist -> temperature (0 = greedy argmax) -> top-k -> top-p -> draw with the
request's own seeded ``torch.Generator``. Logprobs are reported from the *raw* logits
(log-softmax in fp32), i.e. the model's distribution, not the processed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

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


class Sampler:
    """Samples one request's tokens step by step; holds its generator and the penalised ids."""

    def __init__(self, params: SamplingParams, eos_token_ids: tuple[int, ...], prompt_ids: list[int], device="cpu"):
        self.params = params
        eos = () if params.ignore_eos else eos_token_ids
        self.stop_ids = torch.tensor(sorted({*eos, *params.stop_token_ids}), dtype=torch.long)
        self.history = list(prompt_ids)
        self.num_generated = 0
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def is_stop_token(self, token_id: int) -> bool:
        """EOS (unless ``ignore_eos``) or one of ``stop_token_ids``."""
        return bool((self.stop_ids == token_id).any())

    def __call__(self, logits: torch.Tensor) -> TokenLogprob:
        """logits [vocab] of the next position -> the sampled token (+ logprobs when asked)."""
        scores = self.processed(logits)
        if self.params.is_greedy:
            token = int(scores.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator))
        self.history.append(token)
        self.num_generated += 1
        return self._logprob(logits, token) if self.params.logprobs else TokenLogprob(token, 0.0)

    def processed(self, logits: torch.Tensor) -> torch.Tensor:
        """The fp32 scores the next token is drawn from (-inf = excluded); greedy stops before temperature."""
        p = self.params
        scores = logits.float().clone()
        if p.repetition_penalty != 1.0:
            scores = _repetition_penalty(scores, torch.tensor(self.history, device=scores.device), p.repetition_penalty)
        if self.num_generated < p.min_tokens and len(self.stop_ids):
            scores[self.stop_ids.to(scores.device)] = -float("inf")
        if p.is_greedy:
            return scores
        scores = scores / p.temperature
        if p.top_k:
            kth = torch.topk(scores, min(p.top_k, scores.numel())).values[-1]
            scores = scores.masked_fill(scores < kth, -float("inf"))
        return _top_p(scores, p.top_p) if p.top_p < 1.0 else scores

    def _logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top = []
        if self.params.top_logprobs:
            values, ids = torch.topk(logprobs, self.params.top_logprobs)
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        return TokenLogprob(token, float(logprobs[token]), top)


def _repetition_penalty(scores: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style: a seen token's positive logit is divided by ``penalty``, a negative one multiplied."""
    picked = scores.gather(0, ids)
    scores.scatter_(0, ids, torch.where(picked > 0, picked / penalty, picked * penalty))
    return scores


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of best tokens whose probability reaches ``top_p`` (at least one)."""
    sorted_scores, order = torch.sort(scores, descending=True)
    cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
    drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p  # mass before this token already enough
    drop[0] = False
    return scores.scatter(0, order[drop], -float("inf"))
