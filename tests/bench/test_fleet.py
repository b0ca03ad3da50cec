"""benchmarks/fleet/simulate.py on a small fleet (8 replicas, a short trace): it runs the real routing
policy, is deterministic per seed, serves every turn once, and affinity finds prefixes that least-loaded
routing does not. Its curves are the measured sweep's, interpolated between measured concurrencies."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
