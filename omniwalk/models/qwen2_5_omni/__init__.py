"""Qwen2.5-Omni as a model family (``models/registry.py``): ``Options`` and ``PRESETS`` are light;
``Family`` loads torch and the networks, so it is imported on first use."""

from pathlib import Path

from omniwalk.models.qwen2_5_omni.options import Qwen25OmniOptions as Options

# Full-size configs shipped inside the package (``make-tiny --config qwen2.5-omni-7b``, ``serve --model
# qwen2.5-omni-7b --random-weights``). Source: the published Qwen/Qwen2.5-Omni-7B and -3B config.json as
# recalled (no network here), cross-checked against the HF transformers 5.24 ``Qwen2_5Omni*Config``
# defaults (documented as the 7B's: thinker, encoders, DiT, BigVGAN agree). Unverified against the
# files: the talkers' intermediate size, head counts and MRoPE sections (made to sum to head_dim / 2).
_DIR = Path(__file__).parent / "checkpoint" / "presets"
PRESETS = {"qwen2.5-omni-7b": _DIR / "qwen2.5-omni-7b.json", "qwen2.5-omni-3b": _DIR / "qwen2.5-omni-3b.json"}

# speech out per second, by served model name prefix (``omniwalk bench`` sizes speech paths with it)
CODEC_FRAMES_PER_SECOND = {"qwen2.5-omni": 50.0}

__all__ = ["CODEC_FRAMES_PER_SECOND", "Family", "Options", "PRESETS"]


def __getattr__(name: str):
    if name == "Family":
        from omniwalk.models.qwen2_5_omni.family import Qwen25OmniFamily

        return Qwen25OmniFamily
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
