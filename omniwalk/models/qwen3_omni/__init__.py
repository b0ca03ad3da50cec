"""Qwen3-Omni as a model family (``models/registry.py``): ``Options`` and ``PRESETS`` are light;
``Family`` loads torch and the networks, so it is imported on first use."""

from pathlib import Path

from omniwalk.models.qwen3_omni.anchors import ANCHORS
from omniwalk.models.qwen3_omni.options import Qwen3OmniOptions as Options

# Named configs shipped inside the package, so ``make-tiny --config qwen3-omni-30b-a3b``, ``serve --model
# qwen3-omni-30b-a3b --random-weights`` and the full-size benchmarks need nothing outside it: the
# published Instruct config.json verbatim, and for the Thinking variant (text out: its checkpoint
# has no talker or code2wav) the same config with enable_audio_output false.
_DIR = Path(__file__).parent / "checkpoint" / "presets"
PRESETS = {
    "qwen3-omni-30b-a3b": _DIR / "qwen3-omni-30b-a3b-instruct.json",
    "qwen3-omni-30b-a3b-thinking": _DIR / "qwen3-omni-30b-a3b-thinking.json",
}

# speech out per second, by served model name prefix (``omniwalk bench`` sizes speech paths with it)
CODEC_FRAMES_PER_SECOND = {"qwen3-omni": 12.5}

__all__ = ["ANCHORS", "CODEC_FRAMES_PER_SECOND", "Family", "Options", "PRESETS"]


def __getattr__(name: str):
    if name == "Family":
        from omniwalk.models.qwen3_omni.family import Qwen3OmniFamily

        return Qwen3OmniFamily
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
