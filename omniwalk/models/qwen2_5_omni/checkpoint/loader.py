"""Qwen2.5-Omni components of a checkpoint, built on the meta device's shapes and loaded in place.

Each component owns checkpoint prefixes (``load_weights`` names any missing or stray tensor under
them); together they take every tensor of the checkpoint (checked when all components are loaded).
Token2wav is built in fp32, as HF's ``generate`` runs it (``self.token2wav.float()``): its ODE state,
embeddings, speaker encoder and BigVGAN stay fp32 whatever the model's dtype. In a bf16 model the DiT's
per-step layers run in bf16 (``DiT.run_in``): they are nearly all of token2wav's work
(``benchmarks/engine/token2wav.py``), and fp32 matrix products run on the GPU's CUDA cores at a
small fraction of the bf16 tensor-core rate. The bf16 waveform stays close to the fp32 DiT's
(docs/performance.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import REFERENCE, Backends, build_on, check_all_taken, randomize
from omniwalk.models.common.checkpoint.weights import load_weights
from omniwalk.models.common.networks.thinker import Thinker
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import AudioEncoder
from omniwalk.models.qwen2_5_omni.networks.talker import Talker
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import VisionEncoder

# component -> checkpoint prefixes of its submodules ("" = the component itself)
PREFIXES = {
    "audio_encoder": {"": "thinker.audio_tower."},
    "vision_encoder": {"": "thinker.visual."},
    "thinker": {"model": "thinker.model.", "lm_head": "thinker.lm_head."},
    "talker": {"": "talker."},
    "token2wav": {"": "token2wav."},
}
THINKER_COMPONENTS = ("audio_encoder", "vision_encoder", "thinker")


def components(cfg: Qwen25OmniConfig) -> tuple[str, ...]:
    return THINKER_COMPONENTS + (("talker", "token2wav") if cfg.enable_audio_output else ())


def build_component(name: str, cfg: Qwen25OmniConfig, backends: Backends = REFERENCE) -> nn.Module:
    if name == "audio_encoder":
        return AudioEncoder(cfg.audio, backends.attention)
    if name == "vision_encoder":
        return VisionEncoder(cfg.vision, backends.attention)
    if name == "thinker":
        # the talker reads the thinker's last hidden states (after the final norm): no layer tap
        return Thinker(cfg.text, cfg.tokens, cfg.text.num_hidden_layers, deepstack=False)
    if name == "talker" and cfg.talker is not None:
        return Talker(cfg.talker)
    if name == "token2wav" and cfg.token2wav is not None:
        return Token2Wav(cfg.token2wav)
    raise ValueError(f"unknown component {name!r}; known: {components(cfg)}")


def checkpoint_layout(cfg: Qwen25OmniConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of our components in a checkpoint for ``cfg``: name -> shape."""
    names = {}
    for component in components(cfg):
        with torch.device("meta"):
            module = build_component(component, cfg)
        for sub, prefix in PREFIXES[component].items():
            for name, p in (module.get_submodule(sub) if sub else module).named_parameters():
                names[prefix + name] = tuple(p.shape)
    return names


def num_parameters(cfg: Qwen25OmniConfig) -> int:
    return sum(math.prod(shape) for shape in checkpoint_layout(cfg).values())


def load_components(
    ckpt_dir,
    names: tuple[str, ...],
    cfg: Qwen25OmniConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    backends: Backends = REFERENCE,
    random_seed: int | None = None,
) -> dict[str, nn.Module]:
    """Build the named components directly on ``device`` in ``dtype`` and fill them from ``ckpt_dir``
    (or with random weights from ``random_seed``)."""
    out = {}
    for name in names:
        dtype_of = torch.float32 if name == "token2wav" else dtype  # (token2wav: fp32, its DiT below)
        module = build_on(device, dtype_of, lambda: build_component(name, cfg, backends))  # noqa: B023 (called at once)
        if random_seed is not None:
            randomize(module, random_seed)
        else:
            for sub, prefix in PREFIXES[name].items():
                load_weights(module.get_submodule(sub) if sub else module, ckpt_dir, prefix)
        if name == "token2wav" and dtype == torch.bfloat16:
            module.dit.run_in(dtype)
        use_kernels(module, backends.decoder_kernels, backends.persistent_decode)
        out[name] = module.eval()
    if set(names) == set(components(cfg)) and random_seed is None:
        check_all_taken(ckpt_dir, (p for prefixes in PREFIXES.values() for p in prefixes.values()))
    return out
