"""`omniwalk bench` against our live server: fixed work per request, every metric, every file; JSON
out (t2j) checked answer by answer against its schema.

benchmarks/fleet/simulate.py on a small fleet (8 replicas, a short trace): it runs the real routing
policy, is deterministic per seed, serves every turn once, and affinity finds prefixes that least-loaded
routing does not. Its curves are the measured sweep's, interpolated between measured concurrencies.

benchmarks/engine/micro.py end to end on the CPU: a tiny checkpoint, every part, small batches. The figures
are timings (never asserted); what is asserted is the files, their fields, and the counts and unit
conversions that do not depend on speed.

The realtime load generator (benchmarks/realtime/realtime_latency.py) against a live tiny server on the
CPU: 8 sessions of spoken turns with a pause inside, its JSON and table written. Timings are never
asserted; the counts, the fields and the playback arithmetic are."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.live_server import launch, server

from omniwalk.bench.loadgen import RequestRecord
from omniwalk.bench.report import summarize
from omniwalk.bench.schemas import SCHEMAS
from omniwalk.bench.workload import PRESETS, is_valid_json, photo_like, request_body, speech_like
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
# the realtime load generator's own modules (benchmarks/realtime/)
sys.path[:0] = [str(ROOT / "benchmarks" / "realtime"), str(ROOT / "benchmarks")]
from load_stats import discarded_preemptions, engine_counts, histogram_totals, underruns  # noqa: E402
from speech_turns import PHRASES, QUIET_DBFS, RATE, spoken, turn  # noqa: E402


@pytest.fixture(scope="module")
def base():
    with server() as base:
        yield base


def bench(base: str, out, *flags: str, entry=("-m", "omniwalk.cli")) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *entry, "bench", "--base-url", f"{base}/v1", "--out", str(out), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_inputs_are_realistic_and_work_is_fixed():
    audio = speech_like(4.0, seed=1)
    assert audio.shape == (64000,) and 0.1 < abs(audio).max() <= 0.31 and audio.std() > 0.01
    image = photo_like(640, 480, seed=1)
    assert image.shape == (480, 640, 3) and 20 < image.std() < 120
    body = request_body(PRESETS["s2s"], "m", seed=0)
    assert body["max_tokens"] == body["min_tokens"] == 40 and body["ignore_eos"]
    assert body["max_audio_frames"] == body["min_audio_frames"] == 50 and body["modalities"] == ["text", "audio"]
    assert body["messages"][0]["content"][0]["type"] == "input_audio"


def test_bench_against_a_live_server(base, tmp_path):
    proc = bench(
        base,
        tmp_path,
        "--paths",
        "s2t,t2s",
        "--concurrency",
        "1,3",
        "--min-requests",
        "4",
        "--requests-per-concurrency",
        "2",
    )
    # without matplotlib (the main command does not install the [bench] extra): tables and JSON, a hint
    bare = tmp_path / "no_charts"
    blocked = "import sys; sys.modules['matplotlib'] = None; from omniwalk.cli import main; main(sys.argv[1:])"
    no_charts = bench(
        base,
        bare,
        "--paths",
        "s2t",
        "--concurrency",
        "1",
        "--min-requests",
        "2",
        "--requests-per-concurrency",
        "2",
        entry=("-c", blocked),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert no_charts.returncode == 0, no_charts.stdout + no_charts.stderr
    assert "pip install 'omniwalk[bench]'" in no_charts.stderr and "s2t B=1: 3 requests (1 warm-up)" in no_charts.stderr
    assert sorted(f.name for f in bare.iterdir()) == ["results.json", "results.md"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data) == {"s2t@1", "s2t@3", "t2s@1", "t2s@3"}
    for key, cell in data.items():
        s, records = cell["summary"], cell["requests"]
        assert s["errors"] == 0 and s["requests"] == len(records) == (4 if key.endswith("@1") else 6)
        assert all(r["completion_tokens"] == PRESETS[key[:3]].text_tokens for r in records)  # fixed work
        assert all(r["valid"] is None for r in records) and "valid_pct" not in s
        assert s["req_per_s"] > 0 and s["ttft_text_p50"] > 0 and s["e2e_p99"] >= s["e2e_p50"]
        if key.startswith("t2s"):
            assert all(abs(r["audio_seconds"] - (1920 * 50 - 555) / 24000) < 1e-6 for r in records)
            assert s["rtf_p50"] > 0 and s["ttft_audio_p50"] > 0 and s["audio_s_per_s"] > 0
    table = (tmp_path / "results.md").read_text()
    assert table.count("\n") == 6 and "| t2s | 3 |" in table
    assert all((tmp_path / f"{stem}.png").stat().st_size > 1000 for stem in ("req_per_s", "rtf_p50", "ttft_text_p50"))


def test_json_out_is_checked_against_each_requests_schema():
    body = request_body(PRESETS["t2j"], "m", seed=len(SCHEMAS) + 1)  # (round-robin: the corpus' second)
    name = list(SCHEMAS)[1]
    want = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
    assert body["response_format"] == want and body["max_tokens"] == 400
    assert "ignore_eos" not in body and "min_tokens" not in body  # (the grammar ends the answer)
    schema = SCHEMAS["flat_object"]
    assert is_valid_json('{"name": "Ada", "age": 36}', schema)
    assert not is_valid_json('{"name": "Ada", "age": 151}', schema)  # (maximum 150)
    assert not is_valid_json('{"name": "Ada", "age": 36', schema)  # (cut short)
    records = [RequestRecord("t2j", 2, 0.0, end=1.0, valid=v) for v in (True, True, True, False)]
    records.append(RequestRecord("t2j", 2, 0.0, end=1.0, error="HTTP 500"))  # (not finished: not counted)
    assert summarize(records, wall=1.0)["valid_pct"] == 75.0
    assert "valid_pct" not in summarize([RequestRecord("t2t", 2, 0.0, end=1.0)], wall=1.0)  # (no notion of valid)


def test_json_out_against_a_live_server(base, tmp_path):
    """The tiny model has random weights: every valid answer is the grammar's doing."""
    cell = ("--paths", "t2j", "--concurrency", "3", "--min-requests", "6", "--requests-per-concurrency", "2")
    proc = bench(base, tmp_path, *cell, "--warmup-waves", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = json.loads((tmp_path / "results.json").read_text())["t2j@3"]
    s, records = cell["summary"], cell["requests"]
    assert s["errors"] == 0 and len(records) == 6 and s["valid_pct"] == 100.0
    assert all(r["valid"] for r in records)
    assert all(0 < r["completion_tokens"] < PRESETS["t2j"].text_tokens for r in records)  # (ended by the grammar)
    assert s["ttft_text_p50"] > 0 and s["itl_text_mean"] > 0 and s["tok_per_s"] > 0
    table = (tmp_path / "results.md").read_text()
    assert "| valid % | errors |" in table and "| 100.0 | 0 |" in table and "validate against their schema" in table


def test_charts_of_a_text_only_run_leave_out_the_audio_chart(tmp_path):
    from omniwalk.bench.report import _charts

    cells = {("s2t", b): {"req_per_s": 2.0 * b, "audio_s_per_s": 0.0, "ttft_text_p50": 0.1} for b in (1, 32)}
    names = {f.name for f in _charts(tmp_path, cells, {})}
    assert "req_per_s.png" in names and "audio_s_per_s.png" not in names


def test_anchors_come_from_the_served_models_family():
    from omniwalk.models.registry import bench_anchors

    anchors = bench_anchors("qwen3-omni")
    assert set(anchors) == {"M*", "vLLM-Omni"} and anchors["M*"]["s2t"][1]["req_per_s"] == 4.83
    assert bench_anchors("no-such-model") == {}


FLEET = ROOT / "benchmarks" / "fleet"
SHORT = ["--replicas", "8", "--duration-s", "24", "--warmup-s", "6"]


def simulate(tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(FLEET / "simulate.py"), *SHORT, *args, "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def timeless(result: dict) -> list[dict]:
    return [{k: v for k, v in run.items() if k not in ("cpu_s", "wall_s")} for run in result["runs"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("fleet")
    return {
        "seed0": simulate(tmp, "a", "--seed", "0"),
        "again": simulate(tmp, "b", "--seed", "0"),
        "seed1": simulate(tmp, "c", "--seed", "1"),
        "instructions": simulate(tmp, "d", "--seed", "0", "--prefix-scope", "instructions"),
    }


def test_deterministic_per_seed(runs):
    assert timeless(runs["seed0"]) == timeless(runs["again"])
    assert timeless(runs["seed0"]) != timeless(runs["seed1"])


def test_every_turn_is_served_once_and_routed_once(runs):
    for result in runs.values():
        least, affinity = result["runs"]
        assert not least["affinity"] and affinity["affinity"]
        for run in (least, affinity):
            assert run["turns_sent"] == run["turns_served"] > run["turns_measured"] > 100
            assert sum(run["router"].values()) == run["turns_sent"]  # one routing decision a turn
            assert 0 < run["utilisation"]["min"] <= run["utilisation"]["mean"] <= run["utilisation"]["max"] <= 1
            assert run["ttft_s"]["p50"] <= run["ttft_s"]["p99"]
            assert run["first_audio_s"]["p50"] > run["ttft_s"]["p50"] * 0.5 > 0
        assert least["router"] == {"affinity": 0, "fallback": 0, "least_loaded": least["turns_sent"]}
        assert affinity["router"]["least_loaded"] == 0 and affinity["router"]["affinity"] > 0


def test_affinity_finds_prefixes_and_saves_their_prefill(runs):
    least, affinity = runs["seed0"]["runs"]
    assert affinity["affinity_hit_rate"] > 0.5 > 0.3 > least["affinity_hit_rate"]
    assert affinity["ttft_s"]["p50"] < least["ttft_s"]["p50"]  # the earlier turns are not prefilled again
    # with only the instructions reusable (400 tokens), a hit saves less than the whole conversation
    least_i, affinity_i = runs["instructions"]["runs"]
    assert affinity_i["affinity_hit_rate"] == pytest.approx(affinity["affinity_hit_rate"], abs=0.05)
    saved = least["ttft_s"]["p50"] - affinity["ttft_s"]["p50"]
    assert 0 < least_i["ttft_s"]["p50"] - affinity_i["ttft_s"]["p50"] < saved


def test_curves_are_the_measured_points_and_interpolate_between_them(monkeypatch):
    spec = importlib.util.spec_from_file_location("fleet_curves", FLEET / "curves.py")
    curves = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, curves)  # (its dataclasses look their module up)
    spec.loader.exec_module(curves)
    measured = json.loads(curves.SWEEP.read_text())["cells"]
    c = curves.load_curves()
    assert c.max_running == 32
    for path in curves.PATHS:
        for b in (1, 32):
            assert c.at(path, b).ttft == measured[f"{path}@{b}"]["ttft_text_p50"]
            assert c.at(path, b).e2e == measured[f"{path}@{b}"]["e2e_p50"]
        mid = c.at(path, 16)
        assert mid.e2e == pytest.approx(c.at(path, 1).e2e + 15 / 31 * (c.at(path, 32).e2e - c.at(path, 1).e2e))
        assert (mid.first_audio is None) == path.endswith("2t")
    assert 0 < c.prefill_s_per_token < 0.001


FRAME_MS = 80.0  # one talker frame of Code2Wav audio (12.5 Hz)


def micro(*args: str) -> subprocess.CompletedProcess:
    script = ROOT / "benchmarks" / "engine" / "micro.py"
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("micro")
    ckpt = make_tiny_checkpoint(tmp / "tiny")
    sizes = ["--thinker-batches", "1,2", "--talker-batches", "1", "--vocoder-batches", "1,2"]
    sizes += ["--vocoder-frames", "5", "--vocoder-warm-frames", "5", "--encoder-batches", "1,2"]
    sizes += ["--audio-seconds", "1", "--image-size", "64,48", "--steps", "2", "--warmup", "1"]
    sizes += ["--copy-mib", "8", "--matmul-size", "128", "--prompt-words", "12"]
    done = micro(str(ckpt), "--device", "cpu", "--out", str(tmp / "out"), *sizes)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((ckpt / "config.json").read_text())
    return json.loads((tmp / "out" / "micro.json").read_text()), (tmp / "out" / "micro.md").read_text(), config


def test_report_files_hold_every_part(results):
    data, md, _ = results
    assert {"machine", "options", "args", "roofline", "config", "weights", "engine_stats"} <= set(data)
    assert data["options"] == {"device": "cpu", "dtype": "float32"}
    assert data["roofline"]["copy_gb_s"] > 0 and data["roofline"]["matmul_tflop_s"] > 0
    for title in ("Thinker decode step", "Talker step", "Vocoder chunk", "Encoders"):
        assert f"## {title}" in md
    for part in ("thinker", "talker", "vocoder", "encoders"):
        for row in data[part]:
            assert row["ratio"] == pytest.approx(row["ms"] / row["floor_ms"])
            assert row["graph_calls" if part in ("vocoder", "encoders") else "graph_steps"] == 0  # no graphs on CPU
            assert row.get("kernels") is None  # counted on CUDA only (encoders: never)


def test_decode_steps_route_one_token_per_request(results):
    data, _, config = results
    thinker, talker = config["thinker_config"]["text_config"], config["talker_config"]["text_config"]
    assert [r["batch"] for r in data["thinker"]] == [1, 2] and [r["batch"] for r in data["talker"]] == [1]
    b1, b2 = data["thinker"]
    # one decode token per request and step: B=1 hits exactly top-k experts per layer, B=2 between k and 2k
    assert b1["routed_experts"] == thinker["num_experts_per_tok"]
    assert thinker["num_experts_per_tok"] <= b2["routed_experts"] <= 2 * thinker["num_experts_per_tok"]
    assert data["talker"][0]["routed_experts"] == talker["num_experts_per_tok"]
    for row in data["thinker"]:
        assert row["tok_s"] == pytest.approx(row["batch"] / row["ms"] * 1e3)
        assert row["context"] > 12  # keys read per request: at least the prompt's words
    (t,) = data["talker"]
    assert t["rtf"] == pytest.approx(t["ms"] / FRAME_MS) and t["audio_s_per_s"] == pytest.approx(1 / t["rtf"])


def test_vocoder_and_encoder_rows(results):
    data, _, _ = results
    # 5 frames is the first chunk's length: measured from a fresh stream (start 0) and a warm one
    assert [(r["frames"], r["batch"], r["start"]) for r in data["vocoder"]] == [
        (5, 1, 0),
        (5, 1, 5),
        (5, 2, 0),
        (5, 2, 5),
    ]
    for row in data["vocoder"]:
        audio_ms = row["batch"] * row["frames"] * FRAME_MS
        assert row["audio_s_per_s"] == pytest.approx(audio_ms / row["ms"]) and row["gflop"] > 0
    assert [(r["item"], r["batch"]) for r in data["encoders"]] == [
        ("audio", 1),
        ("audio", 2),
        ("image", 1),
        ("image", 2),
    ]
    audio = [r for r in data["encoders"] if r["item"] == "audio"]
    assert all(r["per_s"] == pytest.approx(r["batch"] * 1.0 / r["ms"] * 1e3) for r in audio)
    assert audio[1]["gflop"] == pytest.approx(2 * audio[0]["gflop"])  # two clips: twice the work


def test_unknown_part_is_refused(tmp_path):
    done = micro(str(tmp_path), "--device", "cpu", "--out", str(tmp_path / "out"), "--parts", "thinker,bogus")
    assert done.returncode != 0 and "unknown parts ['bogus']" in done.stderr
    assert not (tmp_path / "out").exists()


SESSIONS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("realtime") / "load.json"
    proc, base = launch()
    try:
        args = ["--base-url", f"{base}/v1", "--sessions", str(SESSIONS), "--turns", "2", "--max-tokens", "1"]
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
    assert sorted(r["session"] for r in records) == sorted(2 * list(range(SESSIONS)))
    for r in records:
        assert r["status"] in ("completed", "incomplete"), r
        assert r["vad_ms"] is not None and r["first_audio_ms"] > r["vad_ms"]
        assert r["answer_ms"] == pytest.approx(r["first_audio_ms"] - r["vad_ms"])
        assert r["audio_s"] == pytest.approx((2 * 1920 - 555) / RATE)  # 2 frames of Code2Wav audio
        assert r["underruns"] == len(r["underrun_at_s"]) and all(0 < at < r["audio_s"] for at in r["underrun_at_s"])
    assert cell["turns"] == 2 * SESSIONS and cell["error_turns"] == 0 and cell["http_cpu_pct_per_session"] > 0
    assert "discarded_preemptions" in cell  # (None where the server does not count them)
    assert cell["engine"]["audio_encoder_items_encoded"] >= SESSIONS  # (each turn's recording, at least)
    assert cell["add_ms_mean"] > 0 and cell["inbox_ms_mean"] >= 0  # (every turn's answer had a first output)
    by_turn = [[r["answer_ms"] for r in records if r["turn"] == t] for t in (0, 1)]
    assert cell["answer_p50_ms_by_turn"] == [sorted(ms)[len(ms) // 2] for ms in by_turn]  # (nearest rank)
    starts = cell["stage_start_ms_mean"]  # (every answer walked the audio encoder, thinker, talker, vocoder)
    assert {"audio_encoder", "thinker", "talker", "vocoder"} <= set(starts) and min(starts.values()) >= 0, starts
    assert data["args"]["speech"] in ("espeak-ng", "synthetic")


def test_a_second_turn_takes_the_first_turns_prompt_from_prefix_pages(run):
    data, _ = run
    cell = data["results"][str(SESSIONS)]
    turns = {(r["session"], r["turn"]): r for r in cell["records"]}
    for session in range(SESSIONS):
        first, second = turns[session, 0], turns[session, 1]
        # (the second prompt holds the first turn, its answer and the new recording: it takes at least every
        # full page of the first prompt before its last token, kept under their keys when that answer ended;
        # 16 tokens a page, the server's default)
        assert second["prompt_tokens"] > first["prompt_tokens"] > 0
        assert (first["prompt_tokens"] - 1) // 16 * 16 <= second["cached_tokens"] < second["prompt_tokens"]
    records = [[r for r in cell["records"] if r["turn"] == t] for t in (0, 1)]
    means = [
        [np.mean([r["prompt_tokens"] for r in rs]), np.mean([r["prompt_tokens"] - r["cached_tokens"] for r in rs])]
        for rs in records
    ]
    assert cell["prompt_tokens_by_turn"] == [pytest.approx(m) for m in means]


def test_the_table_is_written(run):
    _, md = run
    header = md.splitlines()[2]
    assert header.startswith("| sessions | turns | vad_p50_ms | first_audio_p50_ms")
    assert md.splitlines()[4].startswith(f"| {SESSIONS} | {2 * SESSIONS} |")


def test_underruns_are_the_chunks_that_arrive_after_playback_ran_dry():
    second = 2 * RATE  # bytes of one second of PCM16
    assert underruns([]) == []
    assert underruns([(0.0, second), (0.9, second), (1.9, second)]) == []  # each before the last one ends
    # (dry at 1 s of audio out; then 2.0 < 2.5 keeps up, and 4.0 comes after the 3 s out end at 3.5)
    assert underruns([(0.0, second), (1.5, second), (2.0, second), (4.0, second)]) == [1.0, 3.0]


def test_preemption_and_engine_counters_are_found_by_name_and_labels():
    text = (
        'omniwalk_realtime_preemptions_total{outcome="discarded"} 3.0\n'
        'omniwalk_realtime_preemptions_total{outcome="kept"} 5.0\n'
        "omniwalk_realtime_preempt_discarded_total 2\n"
        'omniwalk_engine_events_total{replica="0",stage="thinker",quantity="preemptions"} 7.0\n'
        'omniwalk_engine_events_total{replica="1",stage="thinker",quantity="preemptions"} 1.0\n'
        'omniwalk_engine_events_total{quantity="items_skipped",replica="0",stage="audio_encoder"} 4.0\n'
        'omniwalk_engine{replica="0",stage="thinker",quantity="prefix_tokens"} 112.0\n'
        'omniwalk_engine{replica="0",stage="thinker",quantity="running"} 3.0\n'
    )
    assert discarded_preemptions(text) == 5.0 and discarded_preemptions("up 1\n") is None
    counts = engine_counts(text)
    assert counts["thinker_preemptions"] == 8.0 and counts["audio_encoder_items_skipped"] == 4.0
    assert counts["thinker_prefix_tokens"] == 112.0 and counts["audio_encoder_items_encoded"] == 0.0
    assert "thinker_running" not in counts and engine_counts("up 1\n") == {}
    stages = (
        'omniwalk_stage_start_seconds_bucket{le="0.5",stage="talker"} 2.0\n'
        'omniwalk_stage_start_seconds_sum{stage="talker"} 0.75\n'
        'omniwalk_stage_start_seconds_count{stage="talker"} 3.0\n'
        'omniwalk_stage_start_seconds_sum{replica="1",stage="talker"} 0.25\n'
        'omniwalk_stage_start_seconds_count{replica="1",stage="talker"} 1.0\n'
        'omniwalk_first_output_phase_seconds_sum{phase="add"} 0.5\n'
        'omniwalk_first_output_phase_seconds_count{phase="add"} 4.0\n'
    )
    assert histogram_totals(stages, "omniwalk_stage_start_seconds", "stage") == {"talker": (1.0, 4.0)}
    assert histogram_totals(stages, "omniwalk_first_output_phase_seconds", "phase") == {"add": (0.5, 4.0)}


def test_a_turn_is_two_phrases_with_quiet_between():
    first, second = (spoken(p) for p in PHRASES[0])
    audio = turn(0, 0.4, np.random.default_rng(0))
    assert len(audio) == len(first) + int(0.4 * RATE) + len(second)
    pause = audio[len(first) : len(first) + int(0.4 * RATE)]
    assert np.sqrt(np.mean(pause**2)) < 2 * 10 ** (QUIET_DBFS / 20)
    assert np.sqrt(np.mean(first**2)) > 0.02
