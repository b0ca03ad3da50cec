"""``--model`` names as users have them: a directory, a preset (random weights), a Hugging Face id
in the local cache (no network), each missing piece named; the Thinking variant serves text only.

A second model family through the socket: the engine-core toy LM, registered as an installed
package registers one, run by ``Omni`` and served by ``omniwalk serve`` to the official client."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from helpers import toy_family
from helpers.live_server import launch
from helpers.qwen3_omni import MESSAGES, checkpoint
from helpers.toy_family import ToyFamily, decode, encode
from helpers.toy_lm import make_engine

from omniwalk import Omni
from omniwalk.engine.request import EngineRequest
from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.models import locate as loc
from omniwalk.models.qwen3_omni.checkpoint.tiny import load_config_dict, make_tiny_checkpoint
from omniwalk.models.registry import family_class


def hf_cache(root, repo: str, files=True):
    """``repo`` laid out as huggingface_hub caches it (refs/main -> snapshots/HASH/)."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("0123abcd")
    snapshot = repo_dir / "snapshots" / "0123abcd"
    shutil.copytree(checkpoint("tiny"), snapshot) if files else snapshot.mkdir(parents=True)
    return snapshot


def test_a_hugging_face_id_is_found_in_the_local_cache(tmp_path):
    snapshot = hf_cache(tmp_path, "Qwen/Tiny-Omni")
    assert loc.locate("Qwen/Tiny-Omni", hf_cache=str(tmp_path)) == snapshot
    with pytest.raises(ConfigError, match=r"not in the local Hugging Face cache .*refs/main is missing"):
        loc.locate("Qwen/Other", hf_cache=str(tmp_path))
    for weights in snapshot.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ConfigError, match=r"lacks \*\.safetensors"):
        loc.locate("Qwen/Tiny-Omni", hf_cache=str(tmp_path))
    assert loc.locate("Qwen/Tiny-Omni", random_weights=True, hf_cache=str(tmp_path)) == snapshot
    with pytest.raises(ConfigError, match="no such checkpoint directory, preset"):
        loc.locate(str(tmp_path / "nowhere"))


def test_a_preset_is_a_skeleton_for_random_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(loc, "CACHE", tmp_path)
    with pytest.raises(ConfigError, match="add --random-weights"):
        loc.locate("qwen3-omni-30b-a3b-thinking")
    out = loc.locate("qwen3-omni-30b-a3b-thinking", random_weights=True)
    assert out == tmp_path / "presets" / "qwen3-omni-30b-a3b-thinking"
    assert (out / "tokenizer.json").exists() and not list(out.glob("*.safetensors"))
    assert loc.locate("qwen3-omni-30b-a3b-thinking", random_weights=True) == out  # written once


def test_serve_names_a_missing_cached_model_before_anything_loads(tmp_path):
    cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", "Qwen/Absent", "--hf-cache", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "models--Qwen--Absent" in out.stderr and "engine process" not in out.stdout


def test_a_model_without_audio_output_serves_text_only(tmp_path):
    config = {**load_config_dict(None), "enable_audio_output": False}  # (the Thinking variant's shape)
    text_only = Omni(model=str(make_tiny_checkpoint(tmp_path / "thinking", config)))
    assert text_only.family.info.output_modalities == ("text",) and "talker" not in text_only.engine.stages
    request = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0.0}
    assert text_only.generate(request).token_ids == Omni(model=checkpoint("tiny")).generate(request).token_ids
    with pytest.raises(InvalidRequestError, match="no audio output"):
        text_only.add({**request, "modalities": ["text", "audio"]})


PROMPT = "Hello toy world"
N = 12


def toy_alone(text: str, n: int) -> str:
    """The oracle: the engine-core toy engine itself, no family, no Omni."""
    engine, _ = make_engine()
    req = EngineRequest("solo", ("lm",), {"seq": encode(text), "stop_at": len(text) + n})
    engine.add(req)
    while engine.has_unfinished():
        engine.step()
    return decode([e.data for e in req.events if e.kind == "text"])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return toy_family.install(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory) -> Path:
    return ToyFamily.make_tiny(tmp_path_factory.mktemp("toy-lm"))


def test_omni_runs_an_installed_family(site, toy_checkpoint, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    assert family_class(toy_checkpoint) is ToyFamily
    omni = Omni(model=str(toy_checkpoint), toy_kv_pages=64)  # (the family's own option)
    assert omni.config.family.toy_kv_pages == 64
    out = omni.generate({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N})
    assert out.text == toy_alone(PROMPT, N) and len(out.token_ids) == N and out.finish_reason == "length"
    with pytest.raises(InvalidRequestError, match="no audio output"):
        omni.add({"messages": [{"role": "user", "content": PROMPT}], "modalities": ["text", "audio"]})


def test_omniwalk_serve_serves_it_to_the_openai_client(site, toy_checkpoint):
    root = Path(__file__).parents[2]
    path = [str(site), str(root / "tests"), str(root), os.environ.get("PYTHONPATH", "")]
    proc, base = launch(
        "--toy-kv-pages", "256", model=toy_checkpoint, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    )
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["toy-lm"]
        messages, expected = [{"role": "user", "content": PROMPT}], toy_alone(PROMPT, N)
        reply = client.chat.completions.create(model="toy-lm", messages=messages, max_tokens=N, temperature=0.0)
        assert reply.choices[0].message.content == expected and reply.usage.completion_tokens == N
        stream = client.chat.completions.create(model="toy-lm", messages=messages, max_tokens=N, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
        with pytest.raises(openai.BadRequestError) as e:  # the toy has no audio output
            client.chat.completions.create(model="toy-lm", messages=messages, modalities=["text", "audio"])
        assert e.value.body["param"] == "modalities"
        with pytest.raises(openai.BadRequestError) as e:  # another family's fields are not this one's
            client.chat.completions.create(model="toy-lm", messages=messages, extra_body={"talker_top_k": 5})
        assert e.value.body["code"] == "unknown_parameter"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
