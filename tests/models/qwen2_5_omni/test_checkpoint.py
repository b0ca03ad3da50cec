"""Qwen2.5-Omni checkpoints: config normalisation, the registry, make-tiny (weights, tokenizer,
speakers), loading what HF's ``save_pretrained`` writes, and errors that name what is wrong."""

import json

import pytest
import torch
from helpers.qwen2_5_omni import config_dict, hf_checkpoint
from safetensors.torch import load_file, save_file

from omniwalk.errors import CheckpointError, ConfigError
from omniwalk.models import qwen2_5_omni
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import checkpoint_layout, components, load_components
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.family import read_speakers
from omniwalk.models.registry import family_for_config, family_module
from omniwalk.tokenizer import Tokenizer


def test_registry_maps_what_save_pretrained_writes():
    written = json.loads((hf_checkpoint("tiny") / "config.json").read_text())
    assert written["architectures"] == ["Qwen2_5OmniForConditionalGeneration"]
    assert family_module(hf_checkpoint("tiny")) is qwen2_5_omni
    assert family_for_config("qwen2.5-omni-7b") is qwen2_5_omni


def test_config_reads_hf_layout():
    cfg = Qwen25OmniConfig.from_hf(hf_checkpoint("uneven"))
    raw = config_dict("uneven")
    assert cfg.text.num_attention_heads == 6 and cfg.text.head_dim == 12 and cfg.text.qkv_bias
    assert not cfg.text.qk_norm and not cfg.text.rope.interleaved and cfg.text.rope.mrope_section == (2, 2, 2)
    assert cfg.vision.fullatt_block_indexes == (0, 3) and cfg.vision.window_tokens == 3
    assert cfg.audio.n_window == 25 and cfg.tokens.audio_pad == raw["thinker_config"]["audio_token_index"]
    assert cfg.talker.codec_bos == 8293 and cfg.talker.embedding_size == cfg.text.hidden_size


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("thinker_config", "text_config", "rope_parameters", "mrope_section"), [2, 2, 3], "mrope_section"),
        (("thinker_config", "audio_config", "output_dim"), 12, "audio_config.output_dim"),
        (("thinker_config", "vision_config", "fullatt_block_indexes"), [9], "fullatt_block_indexes"),
        (("thinker_config", "text_config", "use_sliding_window"), True, "use_sliding_window"),
        (("talker_config", "embedding_size"), 8, "talker_config.embedding_size"),
    ],
)
def test_config_errors_name_the_field(path, value, message):
    raw = config_dict("tiny")
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError, match=message):
        Qwen25OmniConfig.from_hf(raw)


@pytest.mark.parametrize("preset", ["qwen2.5-omni-7b", "qwen2.5-omni-3b"])
def test_full_size_presets_normalise(preset, tmp_path):
    cfg = Qwen25OmniConfig.from_hf(qwen2_5_omni.PRESETS[preset])
    assert cfg.text.head_dim == 128 and cfg.vision.fullatt_block_indexes == (7, 15, 23, 31)
    out = make_tiny_checkpoint(tmp_path / preset, preset, with_weights=False)
    assert not list(out.glob("*.safetensors")) and (out / "tokenizer.json").exists()


def test_make_tiny_writes_a_checkpoint_hf_loads(tmp_path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    out = make_tiny_checkpoint(tmp_path / "ckpt", config_dict("uneven"), seed=3)
    cfg = Qwen25OmniConfig.from_hf(out)
    written = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in written.items()} == checkpoint_layout(cfg)
    Qwen2_5OmniForConditionalGeneration.from_pretrained(out).save_pretrained(tmp_path / "again")
    again = load_file(str(tmp_path / "again" / "model.safetensors"))  # HF placed every tensor where it belongs
    for name, tensor in written.items():
        assert torch.equal(again[name], tensor), name
    speakers = read_speakers(out)
    assert set(speakers) == {"chelsie", "ethan"}  # lower case: voices match case-insensitively
    dit = config_dict("uneven")["token2wav_config"]["dit_config"]
    assert speakers["ethan"]["cond"].shape == (1, dit["enc_emb_dim"])
    assert speakers["ethan"]["ref_mel"].shape[::2] == (1, dit["mel_dim"])
    tok = Tokenizer.from_dir(out)
    assert tok.token_to_id("<|AUDIO|>") == cfg.tokens.audio_pad and tok.token_to_id("<|vision_bos|>") == 151652


def test_loads_save_pretrained_output_and_names_missing_tensors(tmp_path):
    cfg = Qwen25OmniConfig.from_hf(hf_checkpoint("tiny"))
    parts = load_components(hf_checkpoint("tiny"), components(cfg), cfg)
    tensors = load_file(str(hf_checkpoint("tiny") / "model.safetensors"))
    k_bias = parts["thinker"].model.layers[1].self_attn.k_proj.bias
    assert torch.equal(k_bias, tensors["thinker.model.layers.1.self_attn.k_proj.bias"])
    assert torch.equal(parts["talker"].thinker_to_talker_proj.weight, tensors["talker.thinker_to_talker_proj.weight"])
    del tensors["thinker.visual.blocks.2.attn.k.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): thinker\.visual\.blocks\.2\.attn\.k\.bias"):
        load_components(tmp_path, ("vision_encoder",), cfg)


def test_bf16_model_runs_the_dit_in_bf16_and_the_rest_of_token2wav_in_fp32():
    cfg = Qwen25OmniConfig.from_hf(hf_checkpoint("tiny"))
    full = load_components(hf_checkpoint("tiny"), ("token2wav",), cfg)["token2wav"]
    half = load_components(hf_checkpoint("tiny"), ("token2wav",), cfg, dtype=torch.bfloat16)["token2wav"]
    assert all(p.dtype == torch.float32 for p in full.parameters())
    assert half.dit.proj_out.weight.dtype == half.dit.transformer_blocks[0].ff.ff[0].weight.dtype == torch.bfloat16
    assert half.dit.time_embed.time_mlp[0].weight.dtype == half.bigvgan.conv_post.weight.dtype == torch.float32
    assert torch.equal(half.dit.proj_out.weight, full.dit.proj_out.weight.bfloat16())


def test_speaker_file_errors(tmp_path):
    with pytest.raises(CheckpointError, match="spk_dict.pt"):
        read_speakers(tmp_path)
    torch.save({"Chelsie": {"bos_token": 1}}, tmp_path / "spk_dict.pt")
    with pytest.raises(CheckpointError, match="needs bos_token, cond and ref_mel"):
        read_speakers(tmp_path)


def test_cli_make_tiny_and_inspect(tmp_path, capsys):
    from helpers.qwen2_5_omni import PACKAGE_TINY

    from omniwalk.cli import main

    assert main(["make-tiny", str(tmp_path / "c"), "--config", str(PACKAGE_TINY)]) == 0
    assert (tmp_path / "c" / "spk_dict.pt").exists() and (tmp_path / "c" / "model.safetensors").exists()
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "c")]) == 0
    shown = capsys.readouterr().out
    params = sum(t.numel() for t in load_file(str(tmp_path / "c" / "model.safetensors")).values())
    assert "qkv_bias=True" in shown and f"{params:,}" in shown


def test_published_spelling_reads_the_same():
    """The published config.json spells rope as ``rope_scaling`` + ``rope_theta``."""
    raw = config_dict("uneven")
    for section in (raw["thinker_config"]["text_config"], raw["talker_config"]):
        params = section.pop("rope_parameters")
        section["rope_theta"] = params.pop("rope_theta")
        section["rope_scaling"] = {**params, "type": "default"}
    assert Qwen25OmniConfig.from_hf(raw) == Qwen25OmniConfig.from_hf(config_dict("uneven"))
