"""The realtime load generator (benchmarks/realtime/realtime_latency.py) against a live tiny server on the
CPU: 8 sessions of spoken turns with a pause inside, its JSON and table written. Timings are never
asserted; the counts, the fields and the playback arithmetic are."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.live_server import launch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "realtime"), str(ROOT / "benchmarks")]
from load_stats import PREEMPT, underruns  # noqa: E402
from speech_turns import PHRASES, QUIET_DBFS, RATE, spoken, turn  # noqa: E402

SESSIONS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("realtime") / "load.json"
    proc, base = launch()
    try:
        args = ["--base-url", f"{base}/v1", "--sessions", str(SESSIONS), "--turns", "1", "--max-tokens", "1"]
        args += ["--audio-frames", "2", "--server-pid", str(proc.pid), "--out", str(out)]
        script = ROOT / "benchmarks" / "realtime" / "realtime_latency.py"
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_every_session_answers_its_turn(run):
    data, _ = run
    cell = data["results"][str(SESSIONS)]
    records = cell["records"]
    assert sorted(r["session"] for r in records) == list(range(SESSIONS))
    for r in records:
        assert r["status"] in ("completed", "incomplete"), r
        assert r["vad_ms"] is not None and r["first_audio_ms"] > r["vad_ms"]
        assert r["answer_ms"] == pytest.approx(r["first_audio_ms"] - r["vad_ms"])
        assert r["audio_s"] == pytest.approx((2 * 1920 - 555) / RATE)  # 2 frames of Code2Wav audio
        assert r["underruns"] >= 0
    assert cell["turns"] == SESSIONS and cell["error_turns"] == 0 and cell["http_cpu_pct_per_session"] > 0
    assert "discarded_preemptions" in cell  # (None where the server does not count them)
    assert data["args"]["speech"] in ("espeak-ng", "synthetic")


def test_the_table_is_written(run):
    _, md = run
    header = md.splitlines()[2]
    assert header.startswith("| sessions | turns | vad_p50_ms | first_audio_p50_ms")
    assert md.splitlines()[4].startswith(f"| {SESSIONS} | {SESSIONS} |")


def test_underruns_count_chunks_that_arrive_after_playback_ran_dry():
    second = 2 * RATE  # bytes of one second of PCM16
    assert underruns([]) == 0
    assert underruns([(0.0, second), (0.9, second), (1.9, second)]) == 0  # each before the last one ends
    assert underruns([(0.0, second), (1.5, second), (2.0, second), (4.0, second)]) == 2


def test_preemption_counters_are_found_by_name_and_labels():
    text = (
        'omniwalk_realtime_preemptions_total{outcome="discarded"} 3.0\n'
        'omniwalk_realtime_preemptions_total{outcome="kept"} 5.0\n'
        "omniwalk_realtime_preempt_discarded_total 2\n"
        'omniwalk_engine_events_total{stage="thinker",quantity="preemptions"} 7\n'
    )
    found = [(n, labels, float(v)) for n, labels, v in PREEMPT.findall(text)]
    assert sum(v for n, labels, v in found if "discard" in n + labels) == 5.0


def test_a_turn_is_two_phrases_with_quiet_between():
    first, second = (spoken(p) for p in PHRASES[0])
    audio = turn(0, 0.4, np.random.default_rng(0))
    assert len(audio) == len(first) + int(0.4 * RATE) + len(second)
    pause = audio[len(first) : len(first) + int(0.4 * RATE)]
    assert np.sqrt(np.mean(pause**2)) < 2 * 10 ** (QUIET_DBFS / 20)
    assert np.sqrt(np.mean(first**2)) > 0.02
