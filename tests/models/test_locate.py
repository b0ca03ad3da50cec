"""``--model`` names as users have them: a directory, a preset (random weights), a Hugging Face id
in the local cache (no network), each missing piece named; the Thinking variant serves text only."""

import shutil
import subprocess
import sys

import pytest
from helpers.qwen3_omni import MESSAGES, checkpoint

from omniwalk import Omni
from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.models import locate as loc
from omniwalk.models.qwen3_omni.checkpoint.tiny import load_config_dict, make_tiny_checkpoint


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
