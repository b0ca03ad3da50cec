"""`omniwalk bench` against our live server: fixed work per request, every metric, every file; JSON
out (t2j) checked answer by answer against its schema."""

import json
import subprocess
import sys

import pytest
from helpers.live_server import server

from omniwalk.bench.loadgen import RequestRecord
from omniwalk.bench.report import summarize
from omniwalk.bench.schemas import SCHEMAS
from omniwalk.bench.workload import PRESETS, is_valid_json, photo_like, request_body, speech_like


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
