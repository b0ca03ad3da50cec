"""benchmarks/engine/micro.py end to end on the CPU: a tiny checkpoint, every part, small batches. The figures
are timings (never asserted); what is asserted is the files, their fields, and the counts and unit
conversions that do not depend on speed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
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
