"""``--quantization fp8`` for Qwen3-Omni: which weights become FP8, and the checkpoints' FP8 format.

Quantised (float8_e4m3fn + block-wise scale_inv, ``layers/fp8.py``): in the thinker and the talker
(with its code predictor), every decoder layer's attention q/k/v/o projections, its routed experts,
its shared expert and its dense MLP. Kept in the model dtype: embeddings, norms, routers and the
shared-expert gate, the heads (lm_head, codec_head, the code predictor's), the talker's text and
hidden projections, the audio and vision encoders and the vocoder.

An FP8 checkpoint is one whose config.json has ``quantization_config`` with ``quant_method: fp8``
(Qwen's FP8 releases, DeepSeek V3's format): its quantised weights are float8_e4m3fn tensors each
with a ``<name>_scale_inv`` float32 grid for ``weight_block_size`` (``activation_scheme`` dynamic:
no activation scales). ``weights.load_weights`` reads either kind into either kind of module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from torch import nn

from omniwalk.config import QUANTIZATIONS
from omniwalk.errors import CheckpointError
from omniwalk.layers.decoder import Attention
from omniwalk.layers.fp8 import DEFAULT_BLOCK, Block, Fp8Linear
from omniwalk.layers.moe import FusedExperts, GatedMLP

__all__ = ["QUANTIZATIONS", "QUANTIZED_COMPONENTS", "checkpoint_block", "quantization_config", "quantize_fp8"]
QUANTIZED_COMPONENTS = ("thinker", "talker")
# module-name patterns Hugging Face's FP8 loader leaves in the model dtype (its ``modules_to_not_convert``)
NOT_CONVERTED = (
    "thinker.audio_tower",
    "thinker.visual",
    "thinker.lm_head",
    "mlp.gate",
    "shared_expert_gate",
    "talker.codec_head",
    "talker.text_projection",
    "talker.hidden_projection",
    "talker.code_predictor.lm_head",
    "code2wav",
)


def checkpoint_block(ckpt_dir: str | Path) -> Block | None:
    """The FP8 block of a checkpoint in the FP8 format, None for one in 16/32-bit weights."""
    config = json.loads((Path(ckpt_dir) / "config.json").read_text())
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if quant.get("quant_method") != "fp8" or quant.get("activation_scheme", "dynamic") != "dynamic":
        raise CheckpointError(
            f"{ckpt_dir}: quantization_config {quant.get('quant_method')!r} "
            f"(activations {quant.get('activation_scheme')!r}) is not supported; only fp8 with dynamic activations"
        )
    block = tuple(quant.get("weight_block_size") or ())
    if len(block) != 2 or any(not isinstance(b, int) or b < 1 or b & (b - 1) for b in block):
        raise CheckpointError(f"{ckpt_dir}: weight_block_size must be two powers of two, got {list(block)}")
    return block


def quantization_config(block: Block = DEFAULT_BLOCK) -> dict:
    """The ``quantization_config`` entry of an FP8 checkpoint's config.json."""
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
        "modules_to_not_convert": list(NOT_CONVERTED),
    }


def _fp8_linears(module: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    for m in module.modules():
        if isinstance(m, Attention):
            yield from ((m, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        elif isinstance(m, GatedMLP):
            yield from ((m, name) for name in ("gate_proj", "up_proj", "down_proj"))


def quantize_fp8(module: nn.Module, block: Block = DEFAULT_BLOCK, empty: bool = False) -> None:
    """Turn ``module``'s decoder projections and experts FP8 in place, one weight at a time (no second
    copy of the model); ``empty``: FP8 storage left uninitialised, for a checkpoint to fill."""
    for parent, name in list(_fp8_linears(module)):
        linear = getattr(parent, name)
        setattr(parent, name, Fp8Linear.empty(linear, block) if empty else Fp8Linear.from_linear(linear, block))
    for m in module.modules():
        if isinstance(m, FusedExperts):
            m.quantize(block, empty)
