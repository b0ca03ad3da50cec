"""Prometheus metrics of the HTTP server and, via the engine's stats messages, of the engine."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
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
        self.e2e = Histogram("omniwalk_e2e_seconds", "Request latency", buckets=_LATENCY, registry=r)
        self.rtf = Histogram(
            "omniwalk_real_time_factor", "Latency / audio duration", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5), registry=r
        )
        self.engine = Gauge("omniwalk_engine", "Engine state, by stage and quantity", ["stage", "quantity"], registry=r)

    def update_engine(self, stats: dict) -> None:
        for stage, values in stats.items():
            for quantity, value in values.items():
                self.engine.labels(stage, quantity).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
