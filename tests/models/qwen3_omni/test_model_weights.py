"""Our real module tree against the checkpoint: HF save_pretrained loads bit-equal, and the module
tree maps onto exactly the published layout."""

import pytest
import torch
from helpers.hf_oracle import hf_checkpoint, hf_model
from helpers.published_layout import checkpoint_layout as published_layout
from safetensors.torch import load_file

from omniwalk.errors import CheckpointError
from omniwalk.models.common.checkpoint.weights import to_checkpoint_names
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import PREFIXES, checkpoint_layout, load_components
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS, make_tiny_checkpoint


@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_module_tree_is_the_published_layout(name):
    cfg = Qwen3OmniConfig.from_hf(hf_checkpoint(name))
    assert checkpoint_layout(cfg) == published_layout(cfg)


def test_module_tree_at_full_size(tmp_path):
    real = PRESETS["qwen3-omni-30b-a3b"]
    cfg = Qwen3OmniConfig.from_hf(real)
    assert checkpoint_layout(cfg) == published_layout(cfg)


@pytest.mark.parametrize("name, sharded", [("tiny", False), ("uneven", False), ("uneven", True)])
def test_hf_checkpoint_loads_into_our_modules_bit_equal(name, sharded, tmp_path):
    ckpt = hf_checkpoint(name)
    saved = load_file(str(ckpt / "model.safetensors"))
    if sharded:  # HF's own sharding: several files + model.safetensors.index.json
        ckpt = tmp_path / "sharded"
        hf_model(name).save_pretrained(ckpt, max_shard_size="10MB")
        assert len(list(ckpt.glob("model-*.safetensors"))) > 1
    components = load_components(ckpt)
    seen = 0
    for component, module in components.items():
        for sub, prefix in PREFIXES[component].items():
            target = module.get_submodule(sub) if sub else module
            for param_name, p in target.named_parameters():
                for ckpt_name, _, (expert, rows) in to_checkpoint_names(param_name, p.shape):
                    value = p if expert is None else p[expert, rows]
                    assert torch.equal(value, saved[prefix + ckpt_name]), prefix + ckpt_name
                    seen += 1
    assert seen == len(saved)


def test_sharded_bf16_load_and_stray_tensor(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "c", seed=3, max_shard_bytes=10_000_000)
    parts = load_components(ckpt, ("thinker", "code2wav"), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for m in parts.values() for p in m.parameters())
    from safetensors.torch import save_file

    save_file({"extra.weight": torch.zeros(1)}, str(ckpt / "model-extra.safetensors"))
    import json

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra.weight"] = "model-extra.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="no component takes"):
        load_components(ckpt)


def test_skeleton_checkpoint_with_random_weights_built_on_the_device(tmp_path):
    from omniwalk import Omni

    skeleton = make_tiny_checkpoint(tmp_path / "skeleton", with_weights=False)
    assert not list(skeleton.glob("*.safetensors"))
    with pytest.raises(CheckpointError):
        Omni(model=str(skeleton))
    omni = Omni(model=str(skeleton), random_weights=True)
    out = omni.generate(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "ignore_eos": True,
            "modalities": ["text", "audio"],
            "min_audio_frames": 3,
            "max_audio_frames": 3,
        }
    )
    assert len(out.token_ids) == 5 and out.codes.shape == (3, 4) and out.audio.isfinite().all()
    params = [p for m in omni.family.parts.values() for p in m.parameters()]
    assert all(p.isfinite().all() and p.abs().max() > 0 for p in params)
