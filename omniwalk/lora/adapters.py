"""Read a PEFT LoRA adapter of the thinker's language model into host tensors, refusing what it cannot serve.

An adapter is PEFT's directory: ``adapter_config.json`` + ``adapter_model.safetensors``. Its keys are
``base_model.model.<module>.lora_{A,B}.weight``, where ``<module>`` is a projection of a thinker layer in
one of the layouts checkpoints use (saved from the thinker alone or from the whole model; transformers 5's
``language_model`` or transformers 4's names)::

    model.language_model.layers.N.   thinker.model.language_model.layers.N.   (transformers 5)
    model.layers.N.                  thinker.model.layers.N.                  (transformers 4)
    then  self_attn.{q,k,v,o}_proj  |  mlp.{gate,up,down}_proj  (a dense MLP: Qwen2.5-Omni's thinker)

PEFT computes ``lora_B(lora_A(x)) * scaling`` with ``scaling = alpha / r`` (``alpha / sqrt(r)`` with
rsLoRA), ``r`` and ``alpha`` per module from ``rank_pattern`` / ``alpha_pattern``. The scaling is folded
into B here (in fp32, then cast), so serving applies ``(x @ A.T) @ B.T`` alone.

Refused, naming the key or field: MoE experts and router (their weights are fused 3-D tensors that PEFT's
LoRA does not target as modules; a LoRA per expert would need a per-expert kernel), the audio and vision
encoders, the talker and vocoder, embeddings and lm_head, DoRA, LoRA biases, ``modules_to_save``, ranks
above ``max_rank``, shapes unlike the base projection's, non-float tensors, and a ``.bin`` checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from omniwalk.errors import InvalidRequestError

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
PREFIX = "base_model.model."
_KEY = re.compile(
    r"(?:thinker\.)?model\.(?:language_model\.)?layers\.(\d+)\."
    r"(?:self_attn\.([qkvo]_proj)|mlp\.((?:gate|up|down)_proj))\.lora_([AB])\.weight"
)
# what a key that is not a thinker projection adapts, for the refusal (first match wins)
_REFUSED = (
    ("lora_magnitude_vector", "DoRA magnitudes (use_dora) are not supported"),
    ("audio_tower", "the audio encoder is not adapted (adapters apply to the thinker's language model)"),
    ("visual", "the vision encoder is not adapted (adapters apply to the thinker's language model)"),
    ("talker", "the talker is not adapted (it reads the adapted thinker's hidden states)"),
    ("code2wav", "the vocoder is not adapted"),
    ("token2wav", "the vocoder is not adapted"),
    ("mlp.experts", "MoE experts are not supported (fused expert weights; attention and dense MLPs are)"),
    ("shared_expert", "MoE shared experts are not supported (attention and dense MLPs are)"),
    ("mlp.gate.", "the MoE router is not supported (attention and dense MLPs are)"),
    ("embed_tokens", "embeddings are not adapted"),
    ("lm_head", "lm_head is not adapted"),
    ("lora_embedding", "embeddings are not adapted"),
)


class AdapterError(InvalidRequestError):
    """An adapter that cannot be served as written; the message names the key or config field at fault."""

    def __init__(self, message: str, param: str | None = "lora_path"):
        super().__init__(message, param)


@dataclass(frozen=True)
class Target:
    """One projection of the thinker an adapter may adapt: ``y[out] = W x[in]``."""

    layer: int
    module: str  # one of ATTENTION_MODULES or MLP_MODULES
    in_features: int
    out_features: int


@dataclass(frozen=True)
class Adapter:
    """An adapter's weights on the host: (layer, module) -> (A [r, in], B [out, r] with the scaling folded in)."""

    name: str
    path: str
    rank: int  # the largest rank among its modules
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def thinker_targets(cfg) -> dict[tuple[int, str], Target]:
    """Every projection of a thinker decoder (a ``layers.decoder.DecoderConfig``) an adapter may adapt:
    q/k/v/o in every layer, gate/up/down where the MLPs are dense."""
    q_out, kv_out = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes = {"q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out), "o_proj": (q_out, h)}
    if not cfg.is_moe:
        shapes |= {"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    return {
        (layer, module): Target(layer=layer, module=module, in_features=i, out_features=o)
        for layer in range(cfg.num_hidden_layers)
        for module, (i, o) in shapes.items()
    }


def load_adapter(
    name: str, path: str, targets: Mapping[tuple[int, str], Target], *, max_rank: int, dtype: torch.dtype
) -> Adapter:
    """Read the PEFT adapter at ``path`` for ``targets``; raise ``AdapterError`` naming what is refused."""
    root = Path(path)
    config = _read_config(root)
    tensors = _read_tensors(root)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    names: dict[tuple[int, str], str] = {}
    for key, tensor in tensors.items():
        layer, module, half, module_name = _parse_key(key)
        if (layer, module) not in targets:
            raise AdapterError(f"adapter {name!r}: {key} targets layer {layer} {module}, which the thinker lacks")
        if not tensor.dtype.is_floating_point:
            raise AdapterError(f"adapter {name!r}: {key} has dtype {tensor.dtype}, not a float type")
        if half in pairs.setdefault((layer, module), {}):
            raise AdapterError(f"adapter {name!r}: {key} duplicates layer {layer} {module}'s lora_{half}")
        pairs[(layer, module)][half] = tensor
        names[(layer, module)] = module_name
    if not pairs:
        raise AdapterError(f"adapter {name!r} at {path} has no LoRA weights of the thinker")
    weights = {
        where: _fold(name, names[where], targets[where], halves, config, max_rank, dtype)
        for where, halves in sorted(pairs.items())
    }
    rank = max(a.shape[0] for a, _ in weights.values())
    return Adapter(name=name, path=str(path), rank=rank, weights=weights)


def _read_config(root: Path) -> dict:
    file = root / "adapter_config.json"
    if not file.is_file():
        raise AdapterError(f"{root} has no adapter_config.json (a PEFT adapter directory is expected)")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{file} is not valid JSON: {e}") from None
    refusals = {
        "peft_type": (config.get("peft_type", "LORA") != "LORA", "only LoRA adapters are served"),
        "use_dora": (bool(config.get("use_dora")), "DoRA is not supported"),
        "bias": (config.get("bias", "none") != "none", "LoRA biases are not supported (bias must be 'none')"),
        "lora_bias": (bool(config.get("lora_bias")), "LoRA biases are not supported"),
        "modules_to_save": (bool(config.get("modules_to_save")), "fully trained modules are not supported"),
        "target_parameters": (bool(config.get("target_parameters")), "parameter (MoE expert) targets are refused"),
    }
    for field, (refused, why) in refusals.items():
        if refused:
            raise AdapterError(f"{file}: {field}={config.get(field)!r}: {why}")
    return config


def _read_tensors(root: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = root / "adapter_model.safetensors"
    if not file.is_file():
        only_bin = (root / "adapter_model.bin").exists()
        why = " (only adapter_model.bin: pickled weights are not read: save safetensors)" if only_bin else ""
        raise AdapterError(f"{root} has no adapter_model.safetensors{why}")
    try:
        return load_file(file)
    except (SafetensorError, OSError) as e:
        raise AdapterError(f"{file} is not a readable safetensors file: {e}") from None


def _parse_key(key: str) -> tuple[int, str, str, str]:
    """``key`` -> (layer, module, "A" or "B", PEFT's module name), or AdapterError saying what it adapts."""
    match = _KEY.fullmatch(key.removeprefix(PREFIX)) if key.startswith(PREFIX) else None
    if match is None:
        why = next((why for part, why in _REFUSED if part in key), "not a LoRA weight of a thinker projection")
        raise AdapterError(f"adapter key {key}: {why}")
    layer, attention, mlp, half = match.groups()
    module_name = key.removeprefix(PREFIX).removesuffix(f".lora_{half}.weight")
    return int(layer), attention or mlp, half, module_name


def _pattern_value(patterns: Mapping[str, float], module_name: str, default: float) -> float:
    """PEFT's per-module ``rank_pattern`` / ``alpha_pattern`` lookup: the first pattern matching the name's tail."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module_name):
            return value
    return default


def _fold(name, module_name, target, halves, config, max_rank, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Check one module's A and B against its target and fold PEFT's scaling into B."""
    for half in "AB":
        if half not in halves:
            raise AdapterError(f"adapter {name!r}: {PREFIX}{module_name}.lora_{half}.weight is missing")
    a, b = halves["A"], halves["B"]
    key = f"{PREFIX}{module_name}.lora_"
    r = int(_pattern_value(config.get("rank_pattern") or {}, module_name, config.get("r", 8)))
    expected = {"A": (r, target.in_features), "B": (target.out_features, r)}
    for half, tensor in halves.items():
        if tuple(tensor.shape) != expected[half]:
            raise AdapterError(
                f"adapter {name!r}: {key}{half}.weight has shape {list(tensor.shape)}, expected "
                f"{list(expected[half])} (rank {r}, {target.module} of {target.in_features} -> {target.out_features})"
            )
    if r > max_rank:
        raise AdapterError(f"adapter {name!r}: {key}A.weight has rank {r}, above the maximum rank {max_rank}")
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module_name, config.get("lora_alpha", 8))
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return a.float().to(dtype).contiguous(), (b.float() * scaling).to(dtype).contiguous()
