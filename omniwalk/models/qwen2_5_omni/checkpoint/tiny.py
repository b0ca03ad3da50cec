"""``omniwalk make-tiny`` for Qwen2.5-Omni: a Hugging Face-style checkpoint with random weights.

Writes config.json, safetensors weights of our components in the checkpoint's naming (the
thinker with its encoders, the talker), ``spk_dict.pt`` (speaker name -> ``bos_token`` (a thinker
id), ``cond`` [1, enc_emb_dim], ``ref_mel`` [1, T, mel_dim], as the published file holds them),
tokenizer.json (byte-level BPE, this model's special-token spellings at their configured ids),
tokenizer_config.json with the chat template, preprocessor_config.json, generation_config.json.
TODO: the token2wav tensors (``token2wav.*``) join the weights when networks/token2wav.py lands.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from omniwalk.models.common.checkpoint import tiny
from omniwalk.models.common.checkpoint.tiny import DEFAULT_MAX_SHARD_BYTES, write_weights
from omniwalk.models.qwen2_5_omni import PRESETS
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import checkpoint_layout
from omniwalk.models.qwen2_5_omni.processing.media_inputs import CLIP_MEAN, CLIP_STD

TINY_CONFIG = Path(__file__).with_name("tiny_config.json")
load_config_dict = functools.partial(tiny.load_config_dict, presets=PRESETS, tiny_config=TINY_CONFIG)
SPECIAL_NAMES = {
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "vision_start": "<|vision_bos|>",
    "vision_end": "<|vision_eos|>",
    "image_pad": "<|IMAGE|>",
    "video_pad": "<|VIDEO|>",
    "audio_start": "<|audio_bos|>",
    "audio_end": "<|audio_eos|>",
    "audio_pad": "<|AUDIO|>",
    "tts_pad": "<|tts_pad|>",
    "tts_bos": "<|tts_bos|>",
    "tts_eos": "<|tts_eos|>",
}
SPEAKERS = {"Chelsie": 151870, "Ethan": 151871}  # name -> the talker's text bos (a thinker id), tiny checkpoints
REF_MEL_FRAMES = 30


def make_tiny_checkpoint(
    out_dir: str | Path,
    config: str | Path | dict | None = None,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    with_weights: bool = True,
) -> Path:
    """Write a checkpoint for ``config`` (default: the packaged tiny config) into ``out_dir``."""
    raw = load_config_dict(config)
    cfg = Qwen25OmniConfig.from_hf(raw)  # validates before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw.setdefault("model_type", "qwen2_5_omni")
    raw.setdefault("architectures", ["Qwen2_5OmniForConditionalGeneration"])
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    if with_weights:
        write_weights(out, checkpoint_layout(cfg), seed, dtype, max_shard_bytes)
    if cfg.enable_audio_output:
        write_speakers(out, raw, seed)
    write_tokenizer_files(out, cfg)
    return out


def write_speakers(out: Path, raw: dict, seed: int) -> None:
    """``spk_dict.pt`` with random conditions sized from ``token2wav_config.dit_config``."""
    dit = raw["token2wav_config"].get("dit_config") or {}
    g = torch.Generator().manual_seed(seed + 7)
    speakers = {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, dit.get("enc_emb_dim", 192), generator=g),
            "ref_mel": torch.randn(1, REF_MEL_FRAMES, dit.get("mel_dim", 80), generator=g),
        }
        for name, bos in SPEAKERS.items()
    }
    torch.save(speakers, out / "spk_dict.pt")


def write_tokenizer_files(out: Path, cfg: Qwen25OmniConfig) -> None:
    processor = "Qwen2_5OmniProcessor", "Qwen2VLImageProcessor"
    preprocessor = tiny.preprocessor_config(*processor, cfg.audio.num_mel_bins, cfg.vision, CLIP_MEAN, CLIP_STD)
    max_length = cfg.text.max_position_embeddings
    tiny.write_tokenizer_files(out, cfg.tokens, SPECIAL_NAMES, max_length, "Qwen2Tokenizer", preprocessor)
