"""What the realtime load generator measures besides latency: playback underruns of an answer's audio,
discarded preemptive answers and (omniwalk) engine counters from the server's /metrics, and the HTTP
process's CPU time.

Playback (``underruns``): the client plays an answer's audio from its first chunk on, in real time,
with no buffer beyond what has arrived; an underrun is a chunk that arrives after everything before
it has finished playing (playback then waits for it and goes on from its arrival).
"""

from __future__ import annotations

import os
import re
import statistics
import urllib.request

SAMPLE_BYTES = 2  # PCM16
OUTPUT_RATE = 24000  # the Realtime API's PCM16 rate
# /metrics series counting preemptive answers that were discarded (the server's realtime counters, where it
# has them): a sample whose name or labels say "preempt" and "discard"
PREEMPT = re.compile(r"^(\w*preempt\w*)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.MULTILINE)
# omniwalk's engine series ({replica, stage, quantity}) read as "<stage>_<quantity>": media items the encoders
# ran and skipped (under prefix pages), prompt tokens taken from prefix pages, KV preemptions
ENGINE = re.compile(r"^omniwalk_engine(?:_events_total)?\{([^}]*)\}\s+([0-9.eE+-]+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
ENGINE_COUNTS = (
    "audio_encoder_items_encoded",
    "audio_encoder_items_skipped",
    "thinker_prefix_tokens",
    "thinker_preemptions",
    "talker_prefix_tokens",
    "talker_preemptions",
)


def underruns(chunks: list[tuple[float, int]]) -> list[float]:
    """Where playing an answer's audio chunks, each (arrival time s, PCM16 bytes), from the first one's arrival
    ran dry: the seconds of audio out before each chunk that came after the audio before it had played (where
    in the answer the stream fell behind: a chunk schedule's late chunk shows at the same place every time)."""
    gaps, playing_until, played = [], chunks[0][0] if chunks else 0.0, 0.0
    for arrived, size in chunks:
        if arrived > playing_until:
            gaps.append(played)
        seconds = size / SAMPLE_BYTES / OUTPUT_RATE
        playing_until, played = max(playing_until, arrived) + seconds, played + seconds
    return gaps


def metrics_text(base_url: str, api_key: str) -> str:
    root = base_url.removesuffix("/").removesuffix("/v1")
    request = urllib.request.Request(f"{root}/metrics", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def discarded_preemptions(text: str) -> float | None:
    """The server's count of discarded preemptive answers in its /metrics ``text``, None where it has none."""
    found = [float(v) for name, labels, v in PREEMPT.findall(text) if "discard" in name + (labels or "")]
    return sum(found) if found else None


def engine_counts(text: str) -> dict[str, float]:
    """omniwalk's engine counters of ``ENGINE_COUNTS`` in its /metrics ``text`` (summed over replicas; none
    from another server): what the engine did for the load besides answering it."""
    counts = dict.fromkeys(ENGINE_COUNTS, 0.0)
    found = False
    for labels, value in ENGINE.findall(text):
        label = dict(LABEL.findall(labels))
        key = f"{label.get('stage')}_{label.get('quantity')}"
        if key in counts:
            counts[key] += float(value)
            found = True
    return counts if found else {}


def histogram_totals(text: str, metric: str, label: str) -> dict[str, tuple[float, float]]:
    """An omniwalk histogram in its /metrics ``text``: label value -> (seconds, observations), summed over
    replicas; none from another server. ``omniwalk_first_output_phase_seconds`` by "phase": "inbox" (waiting
    for the engine process's step loop), "add" (the request's processing in that loop: chat template, tokens,
    prompt, keys), ...; ``omniwalk_stage_start_seconds`` by "stage": from entering the engine to the first work
    in each stage."""
    series = re.compile(rf'^{metric}_(sum|count)\{{[^}}]*{label}="(\w+)"[^}}]*\}}\s+([0-9.eE+-]+)$', re.M)
    totals: dict[str, list[float]] = {}
    for kind, value_of_label, value in series.findall(text):
        totals.setdefault(value_of_label, [0.0, 0.0])[kind == "count"] += float(value)
    return {key: (seconds, count) for key, (seconds, count) in totals.items()}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> dict:
    """mean, p50, p90, max (nearest rank) of ``values``; empty: {}."""
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"mean": statistics.fmean(values), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}
