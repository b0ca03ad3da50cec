"""The synthetic load of the fleet simulator: conversations that start as a Poisson process with bursts.

Two kinds, both closed per conversation (a turn is sent after the previous answer ended):

    chat       1 .. 2*chat_turns_mean-1 turns (uniform), each turn's path drawn from ``chat_mix``,
               an exponential think time (mean think_s_mean) after each answer; key: its prefix digest
    realtime   realtime_turns (uniform in the range) s2s turns; after each answer, its playback
               (realtime_answer_s), the user's next utterance (uniform in speech_s) and the server
               VAD's end-of-turn wait (vad_s); key: the session id

The trace starts in its steady state: conversations also start in the ``lead_s`` before time 0, and
those turns of theirs that would have been sent before 0 (at the given service times) are skipped, so
at 0 the fleet meets conversations at every stage (their later turns carry the skipped turns' tokens).
Every conversation has its own instructions (``system_tokens``), so a later turn can reuse only the
pages its own earlier turns left on a replica. Conversations start at a base rate with bursts: burst
windows of ``burst_s`` start every ``burst_every_s`` on average (Poisson), starting conversations at
``burst_factor`` times the base rate. The base rate is set so that the offered turns average ``load``
times the fleet's measured throughput (at the curves' largest concurrency, for this path mix).
Everything a conversation will do is drawn when it starts, from the trace's own seeded generator, so
two routing policies see the same conversations.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, replace

from curves import PATHS


@dataclass(frozen=True)
class TraceConfig:
    duration_s: float = 45.0  # conversations start in [-lead_s, duration_s); no turn is sent after it
    lead_s: float = 120.0  # longer than a conversation lasts
    warmup_s: float = 10.0  # turns sent before this are served but not measured (the caches fill)
    load: float = 0.7  # offered turns / the fleet's measured throughput
    realtime_share: float = 0.3  # of the offered turns
    chat_mix: tuple[tuple[str, float], ...] = (("s2t", 0.4), ("i2t", 0.2), ("s2s", 0.3), ("i2s", 0.1))
    chat_turns_mean: int = 3
    think_s_mean: float = 6.0
    realtime_turns: tuple[int, int] = (4, 12)
    realtime_answer_s: float = 2.0  # the answer's speech the user listens to before speaking again
    speech_s: tuple[float, float] = (1.0, 4.0)
    vad_s: float = 0.7  # end of speech -> end of turn (the server VAD's silence and hangover)
    system_tokens: int = 400
    burst_every_s: float = 20.0
    burst_s: float = 3.0
    burst_factor: float = 4.0


@dataclass(frozen=True)
class Conversation:
    id: int
    kind: str  # "chat" | "realtime"
    start: float  # its first sent turn's send time (s)
    paths: tuple[str, ...]  # one per turn
    gaps: tuple[float, ...]  # seconds from answer i's end to turn i+1's send
    first: int = 0  # its first sent turn (the earlier ones fell before the trace's start)


def turn_rate(cfg: TraceConfig, throughput: dict[str, float], num_replicas: int) -> float:
    """Offered turns a second: ``load`` times the fleet's throughput for the trace's path mix."""
    share = {path: 0.0 for path in PATHS}
    for path, weight in cfg.chat_mix:
        share[path] += (1 - cfg.realtime_share) * weight / sum(w for _, w in cfg.chat_mix)
    share["s2s"] += cfg.realtime_share
    per_replica = 1 / sum(s / throughput[p] for p, s in share.items())  # time-weighted over the mix
    return cfg.load * per_replica * num_replicas


def conversations(cfg: TraceConfig, rate: float, service_s: dict[str, float], seed: int) -> list[Conversation]:
    """The conversations of a trace offering ``rate`` turns a second on average (``service_s``: a turn's
    time per path, to place the turns of conversations that started before 0)."""
    rng = random.Random(seed)
    realtime_mean = sum(cfg.realtime_turns) / 2
    chat_rate = (1 - cfg.realtime_share) * rate / cfg.chat_turns_mean
    realtime_rate = cfg.realtime_share * rate / realtime_mean
    busy = 1 + (cfg.burst_factor - 1) * min(1.0, cfg.burst_s / cfg.burst_every_s)  # bursts' share of starts
    bursts = _bursts(cfg, rng)
    starts = [a for a, _ in bursts]
    out = []
    for kind, mean_rate in (("chat", chat_rate), ("realtime", realtime_rate)):
        peak = mean_rate / busy * cfg.burst_factor
        t = -cfg.lead_s
        while True:  # thinning: candidates at the peak rate, kept at the rate of their moment
            t += rng.expovariate(peak)
            if t >= cfg.duration_s:
                break
            i = bisect.bisect_right(starts, t) - 1  # the last burst that started by t
            if (i >= 0 and t < bursts[i][1]) or rng.random() < 1 / cfg.burst_factor:
                conv = _skip_to_zero(_conversation(cfg, rng, len(out), kind, t), service_s)
                if conv is not None:
                    out.append(conv)
    out.sort(key=lambda c: (c.start, c.id))
    return out


def _skip_to_zero(conv: Conversation, service_s: dict[str, float]) -> Conversation | None:
    """The conversation from its first turn sent at or after time 0 (None: it ended before 0)."""
    t, i = conv.start, 0
    while t < 0:
        if i + 1 == len(conv.paths):
            return None
        t += service_s[conv.paths[i]] + conv.gaps[i]
        i += 1
    return replace(conv, start=t, first=i)


def _bursts(cfg: TraceConfig, rng: random.Random) -> list[tuple[float, float]]:
    bursts, t = [], -cfg.lead_s
    while (t := t + rng.expovariate(1 / cfg.burst_every_s)) < cfg.duration_s:
        bursts.append((t, t + cfg.burst_s))
    return bursts


def _conversation(cfg: TraceConfig, rng: random.Random, id: int, kind: str, start: float) -> Conversation:
    if kind == "chat":
        n = rng.randint(1, 2 * cfg.chat_turns_mean - 1)
        names, weights = zip(*cfg.chat_mix, strict=True)
        paths = tuple(rng.choices(names, weights, k=n))
        gaps = tuple(rng.expovariate(1 / cfg.think_s_mean) for _ in range(n - 1))
    else:
        n = rng.randint(*cfg.realtime_turns)
        paths = ("s2s",) * n
        gaps = tuple(cfg.realtime_answer_s + rng.uniform(*cfg.speech_s) + cfg.vad_s for _ in range(n - 1))
    return Conversation(id=id, kind=kind, start=start, paths=paths, gaps=gaps)
