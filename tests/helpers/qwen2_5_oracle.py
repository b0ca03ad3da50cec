"""The Qwen2.5-Omni oracle: tiny random HF transformers models, built once per session (tests only)."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

import torch
from helpers.hf_oracle import CONFIG_DIR, TEST_ROOT

from omniwalk.models.common.checkpoint.loader import randomize

PACKAGE_TINY = Path(__file__).parents[2] / "omniwalk" / "models" / "qwen2_5_omni" / "checkpoint" / "tiny_config.json"
# Two shapes: the package's tiny one and one with uneven sizes (6 heads of 12, 3 layers, vision
# windows of 3 tokens with full attention at blocks 0 and 3, 50-frame audio chunks).
TINY_CONFIGS = {"tiny": PACKAGE_TINY, "uneven": CONFIG_DIR / "qwen2_5_tiny_uneven.json"}


def config_dict(name: str) -> dict:
    return json.loads(TINY_CONFIGS[name].read_text())


@cache
def hf_model(name: str, seed: int = 0):
    """A random HF ``Qwen2_5OmniForConditionalGeneration`` (fp32, eval) for a tiny config."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(Qwen2_5OmniConfig(**config_dict(name))).eval()
    randomize(model, seed + 1)  # HF leaves norms at 1 and biases at 0: parity must not pass by symmetry
    return model


@cache
def hf_checkpoint(name: str, seed: int = 0) -> Path:
    """``save_pretrained`` output of :func:`hf_model` in a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix=f"hf25_{name}_", dir=TEST_ROOT))
    hf_model(name, seed).save_pretrained(out)
    return out
