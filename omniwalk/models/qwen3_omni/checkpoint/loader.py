"""All Qwen3-Omni components of a checkpoint, built on the meta device and loaded in place.

Each component owns one checkpoint prefix; together they take every tensor of the checkpoint
(checked: a tensor no component takes is an error, like a missing one). Components a deployment
does not need (e.g. the talker and vocoder for a text-only server) are simply not requested.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from omniwalk.layers.decoder import use_kernels
from omniwalk.layers.fp8 import DEFAULT_BLOCK, FP8
from omniwalk.models.common.checkpoint.loader import REFERENCE, Backends, build_on, check_all_taken, randomize
from omniwalk.models.common.checkpoint.weights import load_weights, to_checkpoint_names
from omniwalk.models.common.networks.thinker import Thinker
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.quantization import (
    QUANTIZATIONS,
    QUANTIZED_COMPONENTS,
    checkpoint_block,
    quantize_fp8,
)
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.talker import Talker
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder

# component -> checkpoint prefixes of its submodules ("" = the component itself)
PREFIXES = {
    "audio_encoder": {"": "thinker.audio_tower."},
    "vision_encoder": {"": "thinker.visual."},
    "thinker": {"model": "thinker.model.", "lm_head": "thinker.lm_head."},
    "talker": {"": "talker."},
    "code2wav": {"": "code2wav."},
}
ALL_COMPONENTS = tuple(PREFIXES)


def checkpoint_layout(cfg: Qwen3OmniConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint for ``cfg``: name -> shape, from our module tree (built on the
    meta device) in the checkpoint's naming (per-expert tensors)."""
    names = {}
    for component in ALL_COMPONENTS:
        with torch.device("meta"):
            module = build_component(component, cfg)
        for sub, prefix in PREFIXES[component].items():
            for name, p in (module.get_submodule(sub) if sub else module).named_parameters():
                names.update({prefix + n: shape for n, shape, _ in to_checkpoint_names(name, p.shape)})
    return names


def fp8_names(cfg: Qwen3OmniConfig) -> list[str]:
    """The checkpoint weights that ``quantization`` "fp8" quantises (each has a ``*_scale_inv``)."""
    names = []
    for component in QUANTIZED_COMPONENTS:
        with torch.device("meta"):
            module = build_component(component, cfg)
            quantize_fp8(module, empty=True)
        for sub, prefix in PREFIXES[component].items():
            for name, p in (module.get_submodule(sub) if sub else module).named_parameters():
                if p.dtype == FP8:
                    names += [prefix + n for n, _, _ in to_checkpoint_names(name, p.shape)]
    return names


def weights_summary(parts: dict[str, nn.Module], quantization: str) -> dict:
    """What ``/v1/models`` and the start-up log say about the weights: the quantisation, what it
    covers, and GiB of parameters per component (FP8 weights with their scales). A tensor two parts
    share (the talker's text embedding is the thinker's when they sit on one device) counts once,
    in the first part that holds it."""
    seen, gib = set(), {}
    for name, m in parts.items():
        fresh = [p for p in m.parameters() if p.data_ptr() not in seen]
        seen.update(p.data_ptr() for p in fresh)
        gib[name] = round(sum(p.numel() * p.element_size() for p in fresh) / 2**30, 3)
    quantized = [name for name in QUANTIZED_COMPONENTS if name in parts] if quantization == "fp8" else []
    return {
        "quantization": quantization,
        "quantized": [f"{name}: decoder attention q/k/v/o and MLP / expert projections" for name in quantized],
        "gib": gib,
        "total_gib": round(sum(gib.values()), 3),
    }


def num_parameters(cfg: Qwen3OmniConfig) -> int:
    return sum(math.prod(shape) for shape in checkpoint_layout(cfg).values())


def build_component(name: str, cfg: Qwen3OmniConfig, backends: Backends = REFERENCE) -> nn.Module:
    if name == "audio_encoder":
        return AudioEncoder(cfg.audio, backends.attention)
    if name == "vision_encoder":
        return VisionEncoder(cfg.vision, backends.attention)
    if name == "thinker":
        return Thinker(cfg.text, cfg.tokens, cfg.talker.accept_hidden_layer, backends.moe)
    if name == "talker":
        return Talker(cfg.talker, backends.moe)
    if name == "code2wav":
        return Code2Wav(cfg.code2wav)
    raise ValueError(f"unknown component {name!r}; known: {ALL_COMPONENTS}")


def load_components(
    ckpt_dir,
    names: tuple[str, ...] = ALL_COMPONENTS,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | Mapping[str, str] = "cpu",
    backends: Backends = REFERENCE,
    cfg: Qwen3OmniConfig | None = None,
    random_seed: int | None = None,
    quantization: str = "none",
    transform: Callable[[str, nn.Module], None] | None = None,
) -> dict[str, nn.Module]:
    """Build the named components from ``ckpt_dir`` directly on ``device`` (one, or one per component
    name) in ``dtype``. ``transform(name, module)`` runs on each loaded component before the fast
    path merges its projections (tensor parallelism splits the weights there: ``omniwalk/parallel``).

    Modules are built on the target device with ``dtype`` as the default dtype, so parameters
    are allocated once, in place, and ``load_weights`` copies each checkpoint tensor into them;
    buffers computed in ``__init__`` (rotary tables, sinusoids) get real values there.
    ``quantization`` "fp8": the weights ``quantization.py`` names are FP8, taken as stored from an
    FP8 checkpoint or quantised one at a time as they are read (random weights: once made).
    """
    cfg = cfg or Qwen3OmniConfig.from_hf(ckpt_dir)
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    block = (None if random_seed is not None else checkpoint_block(ckpt_dir)) or DEFAULT_BLOCK
    out = {}
    for name in names:
        on = device[name] if isinstance(device, Mapping) else device
        module = build_on(on, dtype, lambda: build_component(name, cfg, backends))  # noqa: B023 (called at once)
        quantized = quantization == "fp8" and name in QUANTIZED_COMPONENTS
        if random_seed is not None:
            randomize(module, random_seed)
            if quantized:
                quantize_fp8(module, block)
        else:
            if quantized:
                quantize_fp8(module, block, empty=True)
            for sub, prefix in PREFIXES[name].items():
                load_weights(module.get_submodule(sub) if sub else module, ckpt_dir, prefix, block)
        if transform is not None:
            transform(name, module)
        # (merges and folds loaded weights on the fast path; a persistent kernel stacks them)
        use_kernels(module, backends.decoder_kernels, backends.persistent_decode)
        out[name] = module.eval()
    if set(names) == set(ALL_COMPONENTS) and random_seed is None:
        check_all_taken(ckpt_dir, [p for prefixes in PREFIXES.values() for p in prefixes.values()])
    return out
