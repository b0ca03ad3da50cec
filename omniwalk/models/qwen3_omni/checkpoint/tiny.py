"""``omniwalk make-tiny``: a complete Hugging Face-style Qwen3-Omni checkpoint with random weights.

Writes config.json, safetensors weights in the published naming (per-expert tensors; sharded
with an index above ``max_shard_bytes``), tokenizer.json (real byte-level BPE, special tokens at
their configured ids), tokenizer_config.json with the chat template, preprocessor_config.json
and generation_config.json. Weights are reproducible from the seed and scaled so activations
stay O(1): linears ~ N(0, 1/fan_in) (vocoder decoder convs at half that), norms ~ 1 + N(0, 0.1^2),
biases and log-space Snake parameters ~ N(0, 0.1^2), layer scales ~ 0.1 + |N(0, 0.02^2)|.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from omniwalk.layers.fp8 import DEFAULT_BLOCK
from omniwalk.models.common.checkpoint import tiny
from omniwalk.models.qwen3_omni import PRESETS
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import checkpoint_layout, fp8_names
from omniwalk.models.qwen3_omni.checkpoint.quantization import checkpoint_block, quantization_config

TINY_CONFIG = Path(__file__).with_name("tiny_config.json")
load_config_dict = functools.partial(tiny.load_config_dict, presets=PRESETS, tiny_config=TINY_CONFIG)
# Special-token strings for the ids config.json names (TokenIds field -> string).
SPECIAL_NAMES = {
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "vision_start": "<|vision_start|>",
    "vision_end": "<|vision_end|>",
    "image_pad": "<|image_pad|>",
    "video_pad": "<|video_pad|>",
    "audio_start": "<|audio_start|>",
    "audio_end": "<|audio_end|>",
    "audio_pad": "<|audio_pad|>",
    "tts_pad": "<tts_pad>",
    "tts_bos": "<tts_text_bos>",
    "tts_eos": "<tts_text_eod>",
}
# The published vocabulary's added tokens that are not special (decoding keeps them as text).
TEXT_TOKENS = {
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}


def make_tiny_checkpoint(
    out_dir: str | Path,
    config: str | Path | dict | None = None,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = tiny.DEFAULT_MAX_SHARD_BYTES,
    with_weights: bool = True,
    quantization: str = "none",
) -> Path:
    """Write a checkpoint for ``config`` (default: the packaged tiny config) into ``out_dir``.

    Without weights it is a skeleton (config, tokenizer, templates) for ``random_weights`` runs:
    a full-size benchmark builds its random weights on the GPU instead of reading 70 GB.
    ``quantization`` "fp8": the weights ``quantization.py`` quantises are written in the block-wise
    FP8 format (the same random values, quantised; ``quantization_config`` in config.json).
    """
    raw = load_config_dict(config)
    if quantization == "fp8":
        raw["quantization_config"] = quantization_config(
            tuple(raw.get("quantization_config", {}).get("weight_block_size") or DEFAULT_BLOCK)
        )
    elif quantization != "none":
        raise ValueError(f"quantization must be 'none' or 'fp8', got {quantization!r}")
    cfg = Qwen3OmniConfig.from_hf(raw)  # validates before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw.setdefault("model_type", "qwen3_omni_moe")
    raw.setdefault("architectures", ["Qwen3OmniMoeForConditionalGeneration"])
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    if with_weights:
        fp8 = quantization == "fp8"
        quantized = (fp8_names(cfg), checkpoint_block(out)) if fp8 else ((), None)
        tiny.write_weights(out, checkpoint_layout(cfg), seed, dtype, max_shard_bytes, *quantized, init=random_tensor)
    write_tokenizer_files(out, cfg)
    return out


def random_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """``tiny.random_tensor`` with the vocoder's cases: its transposed convs' fan-in, and half gain for
    its conv decoder, which gains ~2x per Snake block at 1/sqrt(fan_in) (half keeps a random waveform
    unclipped: mean |x| 0.06 vs 0.93 with 87% of samples clipped, tiny configs)."""
    transposed = ".block.1.conv.weight" in name or (
        name.startswith("code2wav.upsample") and name.endswith("0.conv.weight")
    )
    return tiny.random_tensor(name, shape, g, transposed, 0.5 if name.startswith("code2wav.decoder") else 1.0)


def write_tokenizer_files(out: Path, cfg: Qwen3OmniConfig) -> None:
    max_length = cfg.text.max_position_embeddings
    preprocessor = _preprocessor_config(cfg)
    tiny.write_tokenizer_files(out, cfg.tokens, SPECIAL_NAMES, max_length, "Qwen2Tokenizer", preprocessor, TEXT_TOKENS)


def _preprocessor_config(cfg: Qwen3OmniConfig) -> dict:
    """Feature extractor + image processor settings (the published preprocessor_config.json's)."""
    processor = "Qwen3OmniMoeProcessor", "Qwen2VLImageProcessor"
    base = tiny.preprocessor_config(*processor, cfg.audio.num_mel_bins, cfg.vision, (0.5,) * 3, (0.5,) * 3)
    flags = {"do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_resize": True}
    return {**base, **flags, "do_convert_rgb": True}
