"""Full-size component pairs (ours, HF) with identical random bf16 weights on CUDA.

Used by the GPU parity tests and the GPU benchmarks; needs transformers (test extra).
"""

from __future__ import annotations

import json

import torch

from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS

REAL_CONFIG = PRESETS["qwen3-omni-30b-a3b"]


def real_config_dict() -> dict:
    return json.loads(REAL_CONFIG.read_text())


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Well-scaled random content in every parameter (HF init leaves constants and garbage)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            if p.dim() == 1:
                base = 1.0 if "norm" in name or "ln_" in name else 0.0
                p.copy_(base + 0.1 * noise)
            else:
                fan_in = p.shape[-1] if "experts" in name else p[0].numel()
                p.copy_(noise / fan_in**0.5)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _hf(cls_name: str, cfg):
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        return getattr(m, cls_name)(cfg).to(torch.bfloat16).eval()


def audio_pair(seed: int = 0, backend: str = "torch_varlen"):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig

    from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
    from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder

    raw = real_config_dict()
    hf = _hf("Qwen3OmniMoeAudioEncoder", Qwen3OmniMoeAudioEncoderConfig(**raw["thinker_config"]["audio_config"]))
    randomize_(hf, seed)
    with torch.device("cuda"):
        ours = AudioEncoder(Qwen3OmniConfig.from_hf(raw).audio, backend).to(torch.bfloat16).eval()
    ours.load_state_dict(hf.state_dict(), strict=False)
    _check_same_parameters(ours, hf)
    return ours, hf


def vision_pair(seed: int = 0, backend: str = "torch_varlen"):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig

    from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
    from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder

    raw = real_config_dict()
    hf = _hf("Qwen3OmniMoeVisionEncoder", Qwen3OmniMoeVisionEncoderConfig(**raw["thinker_config"]["vision_config"]))
    randomize_(hf, seed)
    with torch.device("cuda"):
        ours = VisionEncoder(Qwen3OmniConfig.from_hf(raw).vision, backend).to(torch.bfloat16).eval()
    ours.load_state_dict(hf.state_dict(), strict=False)
    _check_same_parameters(ours, hf)
    return ours, hf


def _check_same_parameters(ours: torch.nn.Module, hf: torch.nn.Module) -> None:
    theirs = dict(hf.named_parameters())
    mine = dict(ours.named_parameters())
    assert set(mine) == set(theirs), set(mine) ^ set(theirs)
    for name, p in mine.items():
        assert torch.equal(p, theirs[name].view(p.shape)), name


def report(label: str, value: float) -> float:
    """Print a measured parity figure (pytest -s shows it) and return it for the assertion."""
    print(f"GPU-PARITY {label}: {value:.6f}")
    return value
