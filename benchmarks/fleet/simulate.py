"""Fleet simulator: the real routing policy (``omniwalk/serve/routing.py``) in front of many modelled replicas.

    python benchmarks/fleet/simulate.py --replicas 8,64,512 --out benchmarks/results/cpu/fleet.json

A discrete-event simulation, pure Python, seeded and deterministic. The load is ``arrivals.py``'s
conversations (Poisson chat + long realtime sessions, bursts); each turn is routed by
``routing.Router.choose`` over the replicas' unfinished-request counts, with the turn's affinity key
(its conversation), and served by a replica modelled by ``curves.py``'s measured H200 service curves:

    admitted   at once if the replica runs fewer than max_running turns, else when one of them ends
               (first in, first out); it then runs n turns, itself included
    first text admitted + TTFT(path, n) + prefill of the prefix tokens the replica does not hold
    first audio  admitted + first audio(path, n) + the same prefill (speech paths)
    ends       admitted + E2E(path, n) + the same prefill; its prefix pages stay keyed on the replica
               (an LRU of prefix tokens, the KV pool less the running turns' pages)

A turn's times are fixed by the concurrency it is admitted at (not re-evaluated as others come and go).
``--prefix-scope`` is what a replica can reuse: ``conversation`` (every earlier token of the
conversation) or ``instructions`` (only its instructions: the engine keys prefix pages up to the
first media item, and every turn here carries audio or an image). Reported per fleet size and policy
(least loaded = affinity off; affinity = the default RoutingConfig): p50/p99 TTFT and first audio,
replica utilisation (running turns over max_running, time-averaged), the affinity hit rate (later
turns that found their prefix on their replica) and the router's decisions.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import OrderedDict, deque
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from arrivals import Conversation, TraceConfig, conversations, turn_rate  # noqa: E402
from curves import Curves, load_curves, prefix_cache_tokens, turn_tokens  # noqa: E402

from omniwalk.config import RoutingConfig  # noqa: E402
from omniwalk.serve.routing import Router  # noqa: E402

SCOPES = ("conversation", "instructions")


class Replica:
    """One modelled replica; ``name``, ``outstanding`` and ``healthy`` are what the router reads (a
    ``ReplicaLoad``'s fields on a mutable record, so a turn does not rebuild n records)."""

    __slots__ = ("name", "outstanding", "healthy", "running", "queue", "cache", "num_cached", "area", "last")

    def __init__(self, name: str):
        self.name, self.outstanding, self.healthy = name, 0, True
        self.running, self.queue = 0, deque()
        self.cache: OrderedDict[str, int] = OrderedDict()  # key -> prefix tokens held, least recent first
        self.num_cached = 0
        self.area, self.last = 0.0, 0.0  # running-turn seconds inside the measured window; last change


class Turn:
    __slots__ = ("conv", "index", "key", "sent", "prefix", "replica", "wait", "ttft", "first_audio", "done", "hit")

    def __init__(self, conv: Conversation, index: int, sent: float, prefix: int):
        self.conv, self.index, self.key, self.sent, self.prefix = conv, index, f"conv:{conv.id}", sent, prefix
        self.replica = self.wait = self.ttft = self.first_audio = self.done = None
        self.hit = False


class Fleet:
    def __init__(self, curves: Curves, trace: TraceConfig, routing: RoutingConfig, num_replicas: int, scope: str):
        self.curves, self.trace, self.scope = curves, trace, scope
        self.router = Router(routing)
        self.replicas = [Replica(f"replica-{i}") for i in range(num_replicas)]
        self.by_name = {r.name: r for r in self.replicas}
        self.cache_tokens = prefix_cache_tokens(curves.max_running)
        self.events: list = []  # (time, seq, is_finish, turn)
        self.seq = 0
        self.turns: list[Turn] = []

    def run(self, convs: list[Conversation]) -> list[Turn]:
        convs = deque(convs)  # (by start: each joins the event heap when its first turn is due, keeping it small)
        while self.events or convs:
            if convs and (not self.events or convs[0].start <= self.events[0][0]):
                conv = convs.popleft()
                prefix = self.trace.system_tokens + sum(map(turn_tokens, conv.paths[: conv.first]))
                self._send(Turn(conv, conv.first, conv.start, prefix), conv.start)
                continue
            now, _, is_finish, turn = heapq.heappop(self.events)
            if is_finish:
                self._finish(turn, now)
            else:
                self._arrive(turn, now)
        return self.turns

    def _send(self, turn: Turn, at: float) -> None:
        if at < self.trace.duration_s:
            self.turns.append(turn)
            self._push(at, False, turn)

    def _push(self, at: float, is_finish: bool, turn: Turn) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, is_finish, turn))

    def _arrive(self, turn: Turn, now: float) -> None:
        replica = self.by_name[self.router.choose(self.replicas, turn.key)]
        turn.replica = replica
        replica.outstanding += 1
        if replica.running < self.curves.max_running:
            self._admit(replica, turn, now)
        else:
            replica.queue.append(turn)

    def _admit(self, replica: Replica, turn: Turn, now: float) -> None:
        self._account(replica, now)
        turn.wait = now - turn.sent
        replica.running += 1
        held = replica.cache.get(turn.key, 0)
        if held:
            replica.cache.move_to_end(turn.key)
        reused = min(held, self._cacheable(turn.prefix))
        turn.hit = reused > 0
        prefill = (turn.prefix - reused) * self.curves.prefill_s_per_token
        point = self.curves.at(turn.conv.paths[turn.index], replica.running)
        turn.ttft = now + point.ttft + prefill - turn.sent
        if point.first_audio is not None:
            turn.first_audio = now + point.first_audio + prefill - turn.sent
        self._push(now + point.e2e + prefill, True, turn)

    def _finish(self, turn: Turn, now: float) -> None:
        replica, conv = turn.replica, turn.conv
        turn.done = now
        self._account(replica, now)
        replica.running -= 1
        replica.outstanding -= 1
        after = turn.prefix + turn_tokens(conv.paths[turn.index])  # the next turn's prefix
        self._keep(replica, turn.key, self._cacheable(after))
        if replica.queue:
            self._admit(replica, replica.queue.popleft(), now)
        if turn.index + 1 < len(conv.paths):
            self._send(Turn(conv, turn.index + 1, now + conv.gaps[turn.index], after), now + conv.gaps[turn.index])

    def _cacheable(self, prefix: int) -> int:
        return prefix if self.scope == "conversation" else min(prefix, self.trace.system_tokens)

    def _keep(self, replica: Replica, key: str, tokens: int) -> None:
        """Key ``tokens`` prefix pages on the replica, evicting the least recently used keys past its pool."""
        replica.num_cached += tokens - replica.cache.pop(key, 0)
        replica.cache[key] = tokens
        while replica.num_cached > self.cache_tokens:
            replica.num_cached -= replica.cache.popitem(last=False)[1]

    def _account(self, replica: Replica, now: float) -> None:
        """Add the running turns' seconds since the replica's last change, inside the measured window."""
        lo, hi = max(replica.last, self.trace.warmup_s), min(now, self.trace.duration_s)
        if hi > lo:
            replica.area += replica.running * (hi - lo)
        replica.last = now


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def simulate(num_replicas: int, routing: RoutingConfig, trace: TraceConfig, scope: str, seed: int) -> dict:
    """One fleet, one policy, one trace: the summary (every turn sent is checked to end exactly once)."""
    started, cpu = time.perf_counter(), time.process_time()
    curves = load_curves()
    rate = turn_rate(trace, curves.throughput, num_replicas)
    middle = curves.max_running // 2  # (only places the turns of conversations that started before 0)
    convs = conversations(trace, rate, {path: curves.at(path, middle).e2e for path in curves.table}, seed)
    fleet = Fleet(curves, trace, routing, num_replicas, scope)
    turns = fleet.run(convs)
    if any(t.done is None for t in turns) or any(r.outstanding or r.running or r.queue for r in fleet.replicas):
        raise AssertionError("a turn was not served, or a replica still holds one")
    measured = [t for t in turns if t.sent >= trace.warmup_s]
    later = [t for t in measured if t.index > 0]
    window = (trace.duration_s - trace.warmup_s) * curves.max_running
    use = [r.area / window for r in fleet.replicas]

    def p(values: list[float]) -> dict:
        return {"p50": percentile(values, 50), "p99": percentile(values, 99)}

    return {
        "replicas": num_replicas,
        "load": trace.load,
        "affinity": routing.affinity,
        "routing": asdict(routing),
        "seed": seed,
        "turns_sent": len(turns),
        "turns_served": sum(t.done is not None for t in turns),
        "turns_measured": len(measured),
        "realtime_turns_measured": sum(t.conv.kind == "realtime" for t in measured),
        "offered_turns_per_s": rate,  # the trace's nominal rate (conversations cut at its end send fewer)
        "turns_per_s_per_replica": len(measured) / (trace.duration_s - trace.warmup_s) / num_replicas,
        "ttft_s": p([t.ttft for t in measured]),
        "first_audio_s": p([t.first_audio for t in measured if t.first_audio is not None]),
        "realtime_first_audio_s": p([t.first_audio for t in measured if t.conv.kind == "realtime"]),
        "queued_share": sum(t.wait > 0 for t in measured) / max(1, len(measured)),
        "utilisation": {"mean": sum(use) / len(use), "min": min(use), "max": max(use)},
        "affinity_hit_rate": sum(t.hit for t in later) / max(1, len(later)),
        "router": dict(fleet.router.counts),
        "cpu_s": time.process_time() - cpu,  # (the simulator's own CPU time: the machine may be shared)
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="8,64,512", help="fleet sizes, comma-separated (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-scope", choices=SCOPES, default="conversation")
    for f in TraceConfig.__dataclass_fields__.values():
        if isinstance(f.default, (int, float)) and f.name != "load":
            parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    lists = {"load": TraceConfig.load, "saturation": RoutingConfig.saturation, "max_excess": RoutingConfig.max_excess}
    for name, default in lists.items():
        parser.add_argument("--" + name.replace("_", "-"), default=str(default), help="comma-separated: each is run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    given = {k: getattr(args, k) for k in TraceConfig.__dataclass_fields__ if k != "load" and hasattr(args, k)}
    trace = TraceConfig(**given)
    affinity = [
        RoutingConfig(saturation=int(s), max_excess=int(e))
        for s in args.saturation.split(",")
        for e in args.max_excess.split(",")
    ]
    print(HEADER, flush=True)
    runs = []
    for load in map(float, args.load.split(",")):
        for n in map(int, args.replicas.split(",")):
            for policy in [RoutingConfig(affinity=False), *affinity]:
                runs.append(simulate(n, policy, replace(trace, load=load), args.prefix_scope, args.seed))
                print(row(runs[-1]), flush=True)
    result = {"command": " ".join(["python benchmarks/fleet/simulate.py", *(argv or sys.argv[1:])])}
    result |= {"trace": asdict(trace), "prefix_scope": args.prefix_scope, "runs": runs}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def row(r: dict) -> str:
    """One markdown table row of a run (``HEADER``'s columns)."""

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1000 * x:.0f}"

    policy = "least loaded"
    if r["affinity"]:
        routing = r["routing"]
        is_default = routing == asdict(RoutingConfig())
        policy = "affinity" if is_default else f"affinity ({routing['saturation']}, {routing['max_excess']})"
    cells = [r["replicas"], r["load"], policy, f"{r['turns_per_s_per_replica']:.1f}"]
    cells += [ms(r["ttft_s"]["p50"]), ms(r["ttft_s"]["p99"]), ms(r["first_audio_s"]["p50"])]
    cells += [ms(r["first_audio_s"]["p99"]), f"{r['utilisation']['mean']:.2f}"]
    cells += [f"{r['utilisation']['min']:.2f}-{r['utilisation']['max']:.2f}", f"{r['affinity_hit_rate']:.2f}"]
    cells += [f"{r['router']['fallback'] / r['turns_sent']:.2f}", f"{r['cpu_s']:.1f}"]
    return "| " + " | ".join(map(str, cells)) + " |"


HEADER = (
    "| replicas | load | policy | turns/s a replica | TTFT p50 (ms) | TTFT p99 (ms) | first audio p50 (ms) "
    "| first audio p99 (ms) | utilisation | per replica | affinity hits | fallbacks | sim CPU s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)

if __name__ == "__main__":
    sys.exit(main())
