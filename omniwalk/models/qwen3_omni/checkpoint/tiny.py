"""``omniwalk make-tiny``: a complete Hugging Face-style Qwen3-Omni checkpoint with random weights.

Writes config.json, safetensors weights in the published naming (per-expert tensors; sharded
with an index above ``max_shard_bytes``), tokenizer.json (real byte-level BPE, special tokens at
their configured ids), tokenizer_config.json with the chat template, preprocessor_config.json
and generation_config.json. Weights are reproducible from the seed and scaled so activations
stay O(1): linears ~ N(0, 1/fan_in) (vocoder decoder convs at half that), norms ~ 1 + N(0, 0.1^2),
biases and log-space Snake parameters ~ N(0, 0.1^2), layer scales ~ 0.1 + |N(0, 0.02^2)|.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniwalk.layers.fp8 import DEFAULT_BLOCK, Block, quantize
from omniwalk.models.qwen3_omni import PRESETS
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import checkpoint_layout, fp8_names
from omniwalk.models.qwen3_omni.checkpoint.quantization import checkpoint_block, quantization_config
from omniwalk.models.qwen3_omni.checkpoint.tiny_tokenizer import ENDOFTEXT, SPECIAL_NAMES, build_tokenizer
from omniwalk.models.qwen3_omni.checkpoint.weights import SCALE

TINY_CONFIG = Path(__file__).with_name("tiny_config.json")
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3

# The chat layout of the published chat template: media parts become one placeholder each, in content
# order, inside their turn; the processor expands each placeholder to the encoder's count.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('audio', 'input_audio', 'audio_url') -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def load_config_dict(config: str | Path | dict | None) -> dict:
    """A config.json as a dict: a path, a ``PRESETS`` name, a dict (copied), or None (the tiny one)."""
    if config is None:
        config = TINY_CONFIG
    if isinstance(config, dict):
        return json.loads(json.dumps(config))
    return json.loads(PRESETS.get(str(config), Path(config)).read_text())


def make_tiny_checkpoint(
    out_dir: str | Path,
    config: str | Path | dict | None = None,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
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
        write_weights(out, checkpoint_layout(cfg), seed, dtype, max_shard_bytes, *quantized)
    write_tokenizer_files(out, cfg)
    return out


def random_tensor(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=g)
    leaf = name.rsplit(".", 1)[-1]
    is_norm = "norm" in name or ".ln_" in name or name.startswith("ln_")
    if leaf == "weight" and is_norm:
        return 1.0 + 0.1 * noise
    if leaf in ("bias", "alpha", "beta"):
        return 0.1 * noise
    if leaf in ("scale", "gamma"):
        return 0.1 + 0.02 * noise.abs()
    if "embed" in name or "codec_embedding" in name:
        return noise  # lookup tables: unit scale, like the normalised hidden states they feed
    if ".block.1.conv.weight" in name or (name.startswith("code2wav.upsample") and name.endswith("0.conv.weight")):
        fan_in = shape[0] * shape[2]  # transposed conv: [in, out, k]
    else:
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    # The vocoder's conv decoder gains ~2x per Snake block at 1/sqrt(fan_in); half that keeps a
    # random waveform unclipped (mean |x| 0.06 vs 0.93 with 87% of samples clipped, tiny configs).
    gain = 0.5 if name.startswith("code2wav.decoder") else 1.0
    return gain * noise / math.sqrt(fan_in)


def write_weights(
    out: Path,
    layout: dict,
    seed: int,
    dtype: torch.dtype,
    max_shard_bytes: int,
    quantized: Iterable[str] = (),
    fp8_block: Block | None = None,
) -> None:
    """Random tensors for ``layout`` (name -> shape) in ``dtype``, one safetensors file or shards +
    an index; the ``quantized`` names as FP8 in ``fp8_block`` blocks + their scales (the random
    values in fp32, quantised)."""
    g = torch.Generator().manual_seed(seed)
    quantized = set(quantized) if fp8_block else set()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(layout):
        tensor = random_tensor(name, layout[name], g)
        if name in quantized:
            q, scale = quantize(tensor, fp8_block)
            tensors = {name: q, name + SCALE: scale}
        else:
            tensors = {name: tensor.to(dtype)}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1].update(tensors)
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata=meta)
        for name, t in shard.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tokenizer_files(out: Path, cfg: Qwen3OmniConfig) -> None:
    tokenizer = build_tokenizer(cfg.tokens)
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": SPECIAL_NAMES["im_end"],
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": cfg.text.max_position_embeddings,
        "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "preprocessor_config.json").write_text(json.dumps(_preprocessor_config(cfg), indent=2))
    generation = {"eos_token_id": cfg.tokens.im_end, "pad_token_id": tokenizer.token_to_id(ENDOFTEXT)}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _preprocessor_config(cfg: Qwen3OmniConfig) -> dict:
    """Feature extractor + image processor settings (the published preprocessor_config.json's)."""
    v = cfg.vision
    return {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": cfg.audio.num_mel_bins,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 300,
        "n_samples": 4_800_000,
        "nb_max_frames": 30000,
        "dither": 0.0,
        "padding_value": 0.0,
        "padding_side": "right",
        "return_attention_mask": True,
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size,
        "merge_size": v.spatial_merge_size,
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_resize": True,
        "do_convert_rgb": True,
    }
