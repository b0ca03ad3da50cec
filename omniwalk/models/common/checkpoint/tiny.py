"""Writing tiny checkpoints (``omniwalk make-tiny``): random weights in the published naming (one
safetensors file, or shards + an index above ``max_shard_bytes``), reproducible from the seed; the
tokenizer files (real byte-level BPE: ``tiny_tokenizer.py``) with a chat template laid out as the
published ones are. Each family writes its config.json and preprocessor settings."""

from __future__ import annotations

import json
import math
import string
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from omniwalk.layers.fp8 import Block, quantize
from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.checkpoint.tiny_tokenizer import ENDOFTEXT, build_tokenizer
from omniwalk.models.common.checkpoint.weights import SCALE

DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


def load_config_dict(config: str | Path | dict | None, presets: dict[str, Path], tiny_config: Path) -> dict:
    """A config.json as a dict: a path, a ``presets`` name, a dict (copied), or None (``tiny_config``)."""
    if config is None:
        config = tiny_config
    if isinstance(config, dict):
        return json.loads(json.dumps(config))
    return json.loads(presets.get(str(config), Path(config)).read_text())


# The published Qwen3 chat layout; ``$name`` marks a family's special-token spelling. With ``tools``
# the system turn (the system prompt, if any, + "\n\n") carries the tools block; an assistant turn
# renders each of its ``tool_calls`` as a <tool_call> block ("\n" before each but a first one that
# follows no content); a run of ``tool`` messages renders as one user turn of <tool_response> blocks.
CHAT_TEMPLATE = string.Template(r"""
{%- macro render_content(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- else -%}
    {%- for part in content -%}
      {%- if part['type'] == 'text' -%}{{- part['text'] -}}
      {%- elif part['type'] in ('audio', 'input_audio', 'audio_url') -%}{{- '$audio_start$audio_pad$audio_end' -}}
      {%- elif part['type'] in ('image', 'image_url') -%}{{- '$vision_start$image_pad$vision_end' -}}
      {%- elif part['type'] in ('video', 'video_url') -%}{{- '$vision_start$video_pad$vision_end' -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  {{- '${im_start}system\n' -}}
  {%- if messages[0]['role'] == 'system' -%}{{- render_content(messages[0]['content']) + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within ' -}}
  {{- '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' -}}
  {{- '\n</tool_call>${im_end}\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message['role'] == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '${im_start}user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + render_content(message['content']) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '${im_end}\n' -}}{%- endif -%}
  {%- elif not (tools and loop.first and message['role'] == 'system') -%}
    {%- set content = render_content(message['content']) -%}
    {{- '$im_start' + message['role'] + '\n' + content -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {%- set function = call['function'] if call['function'] is defined else call -%}
      {{- '<tool_call>\n{"name": "' + function['name'] + '", "arguments": ' -}}
      {%- if function['arguments'] is string -%}{{- function['arguments'] -}}
      {%- else -%}{{- function['arguments'] | tojson -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '${im_end}\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '${im_start}assistant\n' -}}{%- endif -%}
""")


def chat_template(names: dict[str, str]) -> str:
    """``CHAT_TEMPLATE`` with a family's special-token spellings (``names``: ``TokenIds`` field ->
    string): media parts become one placeholder each, in content order, inside their turn; the
    processor expands each placeholder to the encoder's count."""
    return CHAT_TEMPLATE.substitute(names).strip()


def random_tensor(
    name: str, shape: tuple[int, ...], g: torch.Generator, transposed: bool = False, gain: float = 1.0
) -> torch.Tensor:
    """A random tensor scaled by its name so activations stay O(1): linears ~ N(0, gain^2/fan_in),
    norms ~ 1 + N(0, 0.1^2), biases and log-space Snake parameters ~ N(0, 0.1^2), layer scales
    ~ 0.1 + |N(0, 0.02^2)|, embeddings ~ N(0, 1). ``transposed``: a transposed conv [in, out, k]."""
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
    if transposed:
        fan_in = shape[0] * shape[2]  # transposed conv: [in, out, k]
    else:
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    return gain * noise / math.sqrt(fan_in)


def write_weights(
    out: Path,
    layout: dict,
    seed: int,
    dtype: torch.dtype,
    max_shard_bytes: int,
    quantized: Iterable[str] = (),
    fp8_block: Block | None = None,
    init: Callable = random_tensor,
) -> None:
    """Random tensors (``init(name, shape, generator)``) for ``layout`` (name -> shape) in ``dtype``,
    one safetensors file or shards + an index; the ``quantized`` names as FP8 in ``fp8_block`` blocks
    + their scales (the random values in fp32, quantised)."""
    g = torch.Generator().manual_seed(seed)
    quantized = set(quantized) if fp8_block else set()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(layout):
        tensor = init(name, layout[name], g)
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


def write_tokenizer_files(
    out: Path,
    tokens: TokenIds,
    names: dict[str, str],
    max_length: int,
    tokenizer_class: str,
    preprocessor: dict,
    text_tokens: dict[str, int] | None = None,
) -> None:
    """tokenizer.json (``text_tokens``: its non-special added tokens -> ids), tokenizer_config.json
    (HF's ``tokenizer_class``) + chat_template.jinja (``chat_template(names)``), ``preprocessor`` as
    preprocessor_config.json, generation_config.json."""
    tokenizer = build_tokenizer(tokens, names, text_tokens)
    tokenizer.save(str(out / "tokenizer.json"))
    template = chat_template(names)
    tokenizer_config = {
        "tokenizer_class": tokenizer_class,
        "chat_template": template,
        "eos_token": names["im_end"],
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": max_length,
        "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out / "chat_template.jinja").write_text(template)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    generation = {"eos_token_id": tokens.im_end, "pad_token_id": tokenizer.token_to_id(ENDOFTEXT)}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def preprocessor_config(processor: str, image_processor: str, num_mel_bins: int, vision, mean, std) -> dict:
    """preprocessor_config.json as published: HF's ``processor`` class with a Whisper feature extractor
    and ``image_processor`` for a vision config (``patch_size``, ``temporal_patch_size``,
    ``spatial_merge_size``) normalising with ``mean`` / ``std``."""
    return {
        "processor_class": processor,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": num_mel_bins,
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
        "image_processor_type": image_processor,
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "merge_size": vision.spatial_merge_size,
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "image_mean": list(mean),
        "image_std": list(std),
    }
