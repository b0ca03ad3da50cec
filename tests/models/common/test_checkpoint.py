"""make-tiny: complete HF-loadable checkpoints, reproducible from the seed, with a real tokenizer.

Weight loading: HF save_pretrained -> our parameters bit-equal; corrupted checkpoints fail clearly.

The module under test here is built from the checkpoint layout with experts fused the way our
MoE layers store them, so these tests cover the loader on its own; the model's real module
tree is checked against the same layout in qwen3_omni/test_model_weights.py."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from helpers.hf_oracle import TINY_CONFIGS, hf_checkpoint, hf_model
from safetensors.torch import load_file, save_file
from torch import nn

from omniwalk.errors import CheckpointError
from omniwalk.models.common.checkpoint.weights import load_weights
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import checkpoint_layout
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS, make_tiny_checkpoint

FILES = {
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "generation_config.json",
}


@pytest.mark.parametrize("name, shard_bytes", [("tiny", 2 << 30), ("uneven", 8_000_000)])
def test_hf_from_pretrained_loads_make_tiny(tmp_path, name, shard_bytes):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ckpt = make_tiny_checkpoint(tmp_path / name, TINY_CONFIGS[name], seed=0, max_shard_bytes=shard_bytes)
    assert FILES <= {p.name for p in ckpt.iterdir()}
    assert (ckpt / "model.safetensors.index.json").exists() == (shard_bytes < 2 << 30)
    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    # Loaded values are ours, not re-initialised: compare one fused expert tensor.
    cfg = Qwen3OmniConfig.from_hf(ckpt)
    index = ckpt / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    saved = {k: v for f in files for k, v in load_file(str(ckpt / f)).items()}
    assert set(saved) == set(checkpoint_layout(cfg))
    hf = dict(model.named_parameters())
    gate_up = hf["thinker.model.language_model.layers.0.mlp.experts.gate_up_proj"]
    inter = cfg.text.moe_intermediate_size
    assert torch.equal(gate_up[1, :inter], saved["thinker.model.layers.0.mlp.experts.1.gate_proj.weight"])
    assert torch.equal(hf["code2wav.decoder.0.conv.weight"], saved["code2wav.decoder.0.conv.weight"])


def test_weights_are_seeded_random_and_well_scaled(tmp_path):
    a = load_file(str(make_tiny_checkpoint(tmp_path / "a", seed=3) / "model.safetensors"))
    b = load_file(str(make_tiny_checkpoint(tmp_path / "b", seed=3) / "model.safetensors"))
    c = load_file(str(make_tiny_checkpoint(tmp_path / "c", seed=4) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["thinker.lm_head.weight"], c["thinker.lm_head.weight"])
    for name, t in a.items():
        assert t.abs().max() > 0, f"{name} is all zeros"
        assert t.isfinite().all() and t.abs().max() < 10, name


def test_cli_make_tiny(tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "omniwalk.cli", "make-tiny", str(out), "--seed", "7", "--max-shard-mb", "20"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "done in" in proc.stdout
    assert (out / "model.safetensors.index.json").exists()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "omniwalk.cli",
            "make-tiny",
            str(tmp_path / "bad"),
            "--config",
            str(tmp_path / "no.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0


def test_cli_inspect_reports_real_parameter_count():
    real = PRESETS["qwen3-omni-30b-a3b"]
    proc = subprocess.run(
        [sys.executable, "-m", "omniwalk.cli", "inspect", str(real)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "parameters: 35,259,818,545" in proc.stdout


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fused_module(layout: dict) -> nn.Module:
    """An nn.Module whose parameters are ``layout`` with per-expert tensors fused."""
    shapes, experts = {}, {}
    for name, shape in layout.items():
        m = _EXPERT.match(name)
        if not m:
            shapes[name] = shape
            continue
        stem, e, kind = m[1], int(m[2]), m[3]
        experts.setdefault(stem, {})[(e, kind)] = shape
    for stem, parts in experts.items():
        num = 1 + max(e for e, _ in parts)
        inter, hidden = parts[(0, "gate_proj")]
        shapes[f"{stem}.gate_up_proj"] = (num, 2 * inter, hidden)
        shapes[f"{stem}.down_proj"] = (num, hidden, inter)
    root = nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, nn.Parameter(torch.full(shape, float("nan"))))
    return root


def checkpoint_value(sd: dict, name: str) -> torch.Tensor:
    """Our fused parameter, assembled from HF's saved per-expert tensors."""
    m = re.match(r"^(.*\.experts)\.(gate_up_proj|down_proj)$", name)
    if not m:
        return sd[name]
    stem, kind = m[1], m[2]
    num = len({k.split(".")[-3] for k in sd if k.startswith(stem + ".")})
    if kind == "down_proj":
        return torch.stack([sd[f"{stem}.{e}.down_proj.weight"] for e in range(num)])
    return torch.stack(
        [torch.cat([sd[f"{stem}.{e}.gate_proj.weight"], sd[f"{stem}.{e}.up_proj.weight"]]) for e in range(num)]
    )


@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_hf_save_pretrained_loads_bit_equal(name):
    ckpt = hf_checkpoint(name)
    cfg = Qwen3OmniConfig.from_hf(ckpt)
    module = fused_module(checkpoint_layout(cfg))
    load_weights(module, ckpt)
    saved = load_file(str(ckpt / "model.safetensors"))
    hf_state = dict(hf_model(name).named_parameters())
    assert len(saved) == len(checkpoint_layout(cfg))
    for param_name, value in module.named_parameters():
        assert torch.equal(value, checkpoint_value(saved, param_name)), param_name
    # Spot-check against HF's in-memory fused experts (5.x fuses gate+up the same way we do).
    fused = [k for k in hf_state if k.endswith("experts.gate_up_proj")]
    assert fused
    ours = dict(module.named_parameters())
    hf_layer0 = hf_state["thinker.model.language_model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(ours["thinker.model.layers.0.mlp.experts.gate_up_proj"], hf_layer0)


def test_load_with_prefix_dtype_and_sharded(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", seed=5, max_shard_bytes=10_000_000)
    assert (ckpt / "model.safetensors.index.json").exists()
    cfg = Qwen3OmniConfig.from_hf(ckpt)
    full = fused_module(checkpoint_layout(cfg))
    load_weights(full.bfloat16(), ckpt)
    talker = fused_module(
        {k[len("talker.") :]: v for k, v in checkpoint_layout(cfg).items() if k.startswith("talker.")}
    )
    load_weights(talker, ckpt, prefix="talker.")
    assert all(p.dtype == torch.bfloat16 for p in full.parameters())
    a = dict(full.named_parameters())["talker.model.layers.1.mlp.experts.down_proj"]
    b = dict(talker.named_parameters())["model.layers.1.mlp.experts.down_proj"]
    assert torch.equal(a, b.bfloat16())
    assert not any(torch.isnan(p.float()).any() for p in talker.parameters())


@pytest.fixture
def tiny_single(tmp_path):
    return make_tiny_checkpoint(tmp_path / "single", seed=1)


def _module(ckpt):
    return fused_module(checkpoint_layout(Qwen3OmniConfig.from_hf(ckpt)))


def _rewrite(ckpt, edit):
    path = ckpt / "model.safetensors"
    sd = load_file(str(path))
    edit(sd)
    save_file(sd, str(path))


def test_missing_tensor_is_named(tiny_single):
    _rewrite(tiny_single, lambda sd: sd.pop("talker.codec_head.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*talker\.codec_head\.weight"):
        load_weights(_module(tiny_single), tiny_single)


def test_unexpected_tensor_is_named(tiny_single):
    _rewrite(tiny_single, lambda sd: sd.__setitem__("talker.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected 1 tensor.*talker\.extra\.weight"):
        load_weights(_module(tiny_single), tiny_single)


def test_wrong_shape_is_named(tiny_single):
    _rewrite(tiny_single, lambda sd: sd.__setitem__("code2wav.pre_transformer.norm.weight", torch.ones(7)))
    with pytest.raises(CheckpointError, match=r"code2wav\.pre_transformer\.norm\.weight has shape \(7,\)"):
        load_weights(_module(tiny_single), tiny_single)


def test_wrong_expert_shape_is_named(tiny_single):
    key = "thinker.model.layers.0.mlp.experts.3.up_proj.weight"
    _rewrite(tiny_single, lambda sd: sd.__setitem__(key, torch.ones(3, 3)))
    with pytest.raises(CheckpointError, match=re.escape(key)):
        load_weights(_module(tiny_single), tiny_single)


def test_truncated_shard_names_the_file(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "sharded", seed=2, max_shard_bytes=10_000_000)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shard = ckpt / sorted(set(index["weight_map"].values()))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape(shard.name)):
        load_weights(_module(ckpt), ckpt)


def test_missing_shard_and_missing_weights(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "sharded", seed=2, max_shard_bytes=10_000_000)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    (ckpt / sorted(set(index["weight_map"].values()))[0]).unlink()
    with pytest.raises(CheckpointError, match="does not exist"):
        load_weights(_module(ckpt), ckpt)
    empty = tmp_path / "empty"
    shutil.copytree(ckpt, empty)
    for f in empty.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_weights(_module(ckpt), empty)


def test_weights_summary_counts_a_shared_tensor_once():
    from torch import nn

    from omniwalk.models.qwen3_omni.checkpoint.loader import weights_summary

    table = nn.Embedding(2**14, 2**12)  # 64 Mi parameters in fp32: 0.25 GiB
    parts = {"thinker": nn.Sequential(table, nn.Linear(2**12, 2**12, bias=False)), "text_embedding": table}
    summary = weights_summary(parts, "none")
    assert summary["gib"] == {"thinker": 0.312, "text_embedding": 0.0}
    assert summary["total_gib"] == 0.312
