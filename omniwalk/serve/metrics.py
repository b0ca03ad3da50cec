"""Prometheus metrics of the HTTP server and, via the engine's stats messages, of the engine.

Counters are counters (``*_total``), levels are gauges:

    omniwalk_http_responses_total{route, status}   every response, HTTP-layer rejections (401, 404,
                                                   405, 413, 429, 400, 500) included; "499" = the
                                                   client hung up before the response ended
    omniwalk_requests_total{status}                generation requests by finish reason / failure
    omniwalk_realtime_sessions                     open /v1/realtime WebSocket sessions
    omniwalk_media_queue_depth                     media items submitted to the pool, not yet done
    omniwalk_media_decode_seconds{kind}            one item's decode + preprocessing in a worker
    omniwalk_media_cancelled_total{kind}           media items stopped (mid-decode) or dropped (queued)
                                                   because their request ended first: the client hung
                                                   up (a 499) or another of its items was refused
    omniwalk_stage_start_seconds{stage}            from a request entering the engine to its first work in a
                                                   stage (thinker, talker, vocoder, ...), at its end
    omniwalk_engine{replica, stage, quantity}      engine levels (KV pages, running, waiting, ...); per
                                                   replica also stage="replica": up (1/0), unfinished
    omniwalk_engine_events_total{replica, stage, quantity}  engine counts (preemptions, graph replays, ...)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # (the *_created series read as gauges beside every counter)
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# engine stats quantities that only grow (exported as counters); every other one is a level
ENGINE_COUNTS = (
    "preemptions",
    "graph_replays",
    "eager_decode_steps",
    "eager_calls",
    "lora_loads",  # adapters copied into a slot
    "lora_swaps",  # adapters evicted from their slot for another
    "lora_waits",  # slot requests answered "wait": every slot held
    "items_encoded",  # media items an encoder ran
    "items_skipped",  # media items whose rows no step read (under taken prefix pages)
)


class _EngineCollector:
    """The engines' latest stats reports (per data-parallel replica), read at scrape time."""

    def __init__(self):
        self.stats: dict = {}  # replica -> stage -> quantity -> value

    def collect(self):
        labels = ["replica", "stage", "quantity"]
        levels = GaugeMetricFamily("omniwalk_engine", "Engine state, by stage and quantity", labels=labels)
        counts = CounterMetricFamily(
            "omniwalk_engine_events", "Engine event counts, by stage and quantity", labels=labels
        )
        for replica, stages in self.stats.items():
            for stage, values in stages.items():
                for quantity, value in values.items():
                    (counts if quantity in ENGINE_COUNTS else levels).add_metric([replica, stage, quantity], value)
        yield levels
        yield counts


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.responses = Counter(
            "omniwalk_http_responses", "HTTP responses by route and status", ["route", "status"], registry=r
        )
        self.requests = Counter("omniwalk_requests", "Finished requests by status", ["status"], registry=r)
        self.in_flight = Gauge("omniwalk_requests_in_flight", "Requests being served", registry=r)
        self.ttft = Histogram(
            "omniwalk_time_to_first_token_seconds", "Time to first text", buckets=_LATENCY, registry=r
        )
        self.ttfa = Histogram(
            "omniwalk_time_to_first_audio_seconds", "Time to first audio chunk", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "omniwalk_inter_token_latency_seconds", "Gap between text deltas", buckets=_LATENCY, registry=r
        )
        self.phases = Histogram(
            "omniwalk_first_output_phase_seconds",
            "Time to a request's first output by phase: inbox (to the engine process, which ends its step "
            "first), add (processing its inputs), engine (admitted to first output), outbox (back to HTTP)",
            ["phase"],
            buckets=_LATENCY,
            registry=r,
        )
        self.stage_start = Histogram(
            "omniwalk_stage_start_seconds",
            "Time from a request entering the engine to its first work in each stage of its walk (observed when it "
            "finishes): where a pipeline's first output waits",
            ["stage"],
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram("omniwalk_e2e_seconds", "Request latency", buckets=_LATENCY, registry=r)
        self.rtf = Histogram(
            "omniwalk_real_time_factor", "Latency / audio duration", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5), registry=r
        )
        self.media_queue = Gauge("omniwalk_media_queue_depth", "Media items in the decode pool", registry=r)
        self.media_seconds = Histogram(
            "omniwalk_media_decode_seconds", "Media decode + preprocessing time", ["kind"], buckets=_LATENCY, registry=r
        )
        self.media_cancelled = Counter(
            "omniwalk_media_cancelled", "Media items stopped because their request ended", ["kind"], registry=r
        )
        self.realtime_sessions = Gauge("omniwalk_realtime_sessions", "Open /v1/realtime sessions", registry=r)
        self._engine = _EngineCollector()
        r.register(self._engine)

    def update_engine(self, stats: dict) -> None:
        self._engine.stats = stats

    def render(self) -> bytes:
        return generate_latest(self.registry)
