"""The correctness oracle: tiny random HF transformers Qwen3-Omni models, built once per session, and the
LoRA adapters PEFT writes for the tiny checkpoints (with the HF + PEFT model that runs them).

Tests only; omniwalk never imports transformers at run time.

LoRA adapters of the tiny checkpoints' thinkers written by PEFT's own ``save_pretrained`` (random non-zero
weights: ``init_lora_weights=False``), and the HF + PEFT model that runs them as the oracle.

The HF model is a fresh one per call (PEFT injects its layers in place: never the cached oracles others share)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from omniwalk.models.common.checkpoint.loader import randomize

TEST_ROOT = tempfile.mkdtemp(prefix="omniwalk-tests-")  # the checkpoints tests write, removed at exit
atexit.register(shutil.rmtree, TEST_ROOT, True)

PACKAGE_TINY = Path(__file__).parents[2] / "omniwalk" / "models" / "qwen3_omni" / "checkpoint" / "tiny_config.json"
# The uneven tiny shape: the packaged tiny config with these fields changed (odd head dims, 3 code groups,
# 5/6 experts, deepstack at [1, 3], sliding window 5).
UNEVEN = {
    "thinker_config": {
        "audio_config": {
            "d_model": 24,
            "encoder_layers": 3,
            "encoder_attention_heads": 3,
            "encoder_ffn_dim": 40,
            "downsample_hidden_size": 6,
            "output_dim": 48,
            "n_window_infer": 400,
        },
        "vision_config": {
            "depth": 4,
            "hidden_size": 40,
            "intermediate_size": 56,
            "out_hidden_size": 48,
            "num_position_embeddings": 49,
            "deepstack_visual_indexes": [1, 3],
        },
        "text_config": {
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 6,
            "head_dim": 12,
            "num_experts": 5,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 20,
            "rope_parameters": {"mrope_section": [2, 2, 2]},
        },
    },
    "talker_config": {
        "accept_hidden_layer": 2,
        "num_code_groups": 3,
        "thinker_hidden_size": 48,
        "text_config": {
            "hidden_size": 40,
            "intermediate_size": 72,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 12,
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 12,
            "shared_expert_intermediate_size": 20,
            "rope_parameters": {"mrope_section": [2, 2, 2]},
        },
        "code_predictor_config": {
            "hidden_size": 40,
            "intermediate_size": 56,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 10,
            "num_code_groups": 3,
        },
    },
    "code2wav_config": {
        "num_quantizers": 3,
        "hidden_size": 24,
        "intermediate_size": 40,
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "num_key_value_heads": 3,
        "sliding_window": 5,
        "decoder_dim": 48,
    },
}


def overlay(config: dict, changes: dict) -> dict:
    """``config`` with ``changes`` written over it, nested dicts field by field (the key order kept)."""
    return {
        k: overlay(v, changes[k]) if isinstance(v, dict) and k in changes else changes.get(k, v)
        for k, v in config.items()
    }


def write_config(name: str, package_tiny: Path, changes: dict) -> Path:
    """The packaged tiny config with ``changes``, written as ``name``.json under TEST_ROOT (a config file, as
    make-tiny and the loaders read one)."""
    path = Path(TEST_ROOT) / f"{name}.json"
    path.write_text(json.dumps(overlay(json.loads(package_tiny.read_text()), changes), indent=2))
    return path


# Two shapes of tiny model: the reference one and the uneven one.
TINY_CONFIGS = {"tiny": PACKAGE_TINY, "uneven": write_config("tiny_uneven", PACKAGE_TINY, UNEVEN)}


def config_dict(name: str) -> dict:
    return json.loads(TINY_CONFIGS[name].read_text())


def hf_model(name: str, seed: int = 0):
    """A random HF ``Qwen3OmniMoeForConditionalGeneration`` (fp32, eval) for a tiny config."""
    return _hf_model(name, seed)  # one cache key however the arguments are spelled


@cache
def _hf_model(name: str, seed: int):
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    cfg = Qwen3OmniMoeConfig(**config_dict(name))
    # NOTE: HF bug workaround (reference §9.6): the talker's get_rope_index reads audio_config.
    cfg.talker_config.audio_config = cfg.thinker_config.audio_config
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    # HF leaves some tensors uninitialised (garbage or NaN, e.g. talker experts of some sizes) and
    # others constant (norms 1, biases and Snake parameters 0); parity must not pass by symmetry.
    randomize(model, seed + 1)
    return model


def hf_checkpoint(name: str, seed: int = 0) -> Path:
    """``save_pretrained`` output of :func:`hf_model` in a temporary directory."""
    return _hf_checkpoint(name, seed)


@cache
def _hf_checkpoint(name: str, seed: int) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"hf_{name}_", dir=TEST_ROOT))
    hf_model(name, seed).save_pretrained(out)
    return out


def whisper_extractor():
    """HF's feature extractor configured as the Qwen3-Omni processor uses it (reference §1.8)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=128,
        sampling_rate=16000,
        hop_length=160,
        chunk_length=300,
        n_fft=400,
        padding_value=0.0,
        dither=0.0,
        return_attention_mask=True,
    )


def assert_parity(ours: torch.Tensor, ref: torch.Tensor):
    """An encoder's output against HF's: same shape, cosine >= 0.99999, max error within 1e-4 of the largest value."""
    assert ours.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(ours.flatten().double(), ref.flatten().double(), dim=0)
    assert cos >= 0.99999
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
ENCODERS = r".*(audio_tower|visual).*"  # their q/k/v share the language model's names


@dataclass(frozen=True)
class AdapterSpec:
    r: int
    alpha: int
    modules: tuple[str, ...] = ATTENTION
    rslora: bool = False
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)

    def config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            target_modules=list(self.modules),
            exclude_modules=ENCODERS,
            use_rslora=self.rslora,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern=dict(self.alpha_pattern),
            init_lora_weights=False,
        )


def peft_model(hf_model, specs: dict[str, AdapterSpec], seed: int = 0) -> tuple[object, dict[str, Path]]:
    """``hf_model``'s thinker with one PEFT adapter per spec (named as its key), each saved by PEFT into a
    directory of its own -> (the PEFT model, name -> directory). ``set_adapter(name)`` picks the oracle's."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    (first, spec), *rest = specs.items()
    model = get_peft_model(hf_model.thinker, spec.config(), adapter_name=first)
    for name, spec in rest:
        model.add_adapter(name, spec.config())
    paths = {}
    for name in specs:
        out = Path(tempfile.mkdtemp(prefix=f"lora_{name}_", dir=TEST_ROOT))
        model.save_pretrained(out, selected_adapters=[name])
        paths[name] = next(p.parent for p in out.rglob("adapter_config.json"))  # (PEFT nests non-default names)
    return model.eval(), paths


@torch.no_grad()
def hf_greedy(model, adapter: str | None, prompt_ids: list[int], steps: int) -> list[int]:
    """HF + PEFT greedy ids of the thinker with ``adapter`` (None: the base model, adapters off)."""
    x = torch.tensor([prompt_ids])
    kwargs = {"attention_mask": torch.ones_like(x), "max_new_tokens": steps, "min_new_tokens": steps}
    if adapter is None:
        with model.disable_adapter():
            out = model.base_model.model.generate(input_ids=x, do_sample=False, **kwargs)
    else:
        model.set_adapter(adapter)
        out = model.base_model.model.generate(input_ids=x, do_sample=False, **kwargs)
    return out[0, x.shape[1] :].tolist()
