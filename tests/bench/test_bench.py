"""`omniwalk bench` against our live server: fixed work per request, every metric, every file."""

import json
import subprocess
import sys

from helpers.live_server import server

from omniwalk.bench.workload import PRESETS, photo_like, request_body, speech_like


def test_inputs_are_realistic_and_work_is_fixed():
    audio = speech_like(4.0, seed=1)
    assert audio.shape == (64000,) and 0.1 < abs(audio).max() <= 0.31 and audio.std() > 0.01
    image = photo_like(640, 480, seed=1)
    assert image.shape == (480, 640, 3) and 20 < image.std() < 120
    body = request_body(PRESETS["s2s"], "m", seed=0)
    assert body["max_tokens"] == body["min_tokens"] == 40 and body["ignore_eos"]
    assert body["max_audio_frames"] == body["min_audio_frames"] == 50 and body["modalities"] == ["text", "audio"]
    assert body["messages"][0]["content"][0]["type"] == "input_audio"


def test_bench_against_a_live_server(tmp_path):
    with server() as base:
        cmd = [
            sys.executable,
            "-m",
            "omniwalk.cli",
            "bench",
            "--base-url",
            f"{base}/v1",
            "--paths",
            "s2t,t2s",
            "--concurrency",
            "1,3",
            "--min-requests",
            "4",
            "--requests-per-concurrency",
            "2",
            "--out",
            str(tmp_path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        # without matplotlib (the main command does not install the [bench] extra): tables and JSON, a hint
        bare = tmp_path / "no_charts"
        blocked = "import sys; sys.modules['matplotlib'] = None; from omniwalk.cli import main; main(sys.argv[1:])"
        one_cell = [*cmd[3:6], "--paths", "s2t", "--concurrency", "1", "--min-requests", "2"]
        one_cell += ["--requests-per-concurrency", "2", "--out", str(bare)]
        no_charts = subprocess.run(
            [sys.executable, "-c", blocked, *one_cell], capture_output=True, text=True, timeout=600
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
        assert s["req_per_s"] > 0 and s["ttft_text_p50"] > 0 and s["e2e_p99"] >= s["e2e_p50"]
        if key.startswith("t2s"):
            assert all(abs(r["audio_seconds"] - (1920 * 50 - 555) / 24000) < 1e-6 for r in records)
            assert s["rtf_p50"] > 0 and s["ttft_audio_p50"] > 0 and s["audio_s_per_s"] > 0
    table = (tmp_path / "results.md").read_text()
    assert table.count("\n") == 6 and "| t2s | 3 |" in table
    assert all((tmp_path / f"{stem}.png").stat().st_size > 1000 for stem in ("req_per_s", "rtf_p50", "ttft_text_p50"))


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
